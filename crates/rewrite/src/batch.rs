//! Dimensions as affine functions of the batch, for shapes that symbolic inference
//! cannot name.

use edgefreeze_graph::infer::{Inference, infer};
use edgefreeze_graph::ir::{Dim, Model};
use std::collections::HashMap;

/// Batch sizes the model is inferred at to find each dimension's [`BatchForms`]: two
/// give `a` and `c`, the third checks that the dimension is affine in the batch.
const PROBE_BATCHES: [i64; 3] = [2, 3, 7];

/// Every dimension of every value of a model whose data inputs have one symbolic
/// dimension (the batch B), as `a·B + c` where it is affine in B: the shapes inference
/// gives with B set to each of [`PROBE_BATCHES`], which fold every shape computation.
pub(crate) struct BatchForms {
    /// The batch symbol.
    symbol: String,
    forms: HashMap<String, Vec<Option<(i64, i64)>>>,
}

impl BatchForms {
    /// `None` when the data inputs have no symbolic dimension or more than one, or the
    /// model does not infer at a fixed batch.
    pub(crate) fn of(model: &Model) -> Option<BatchForms> {
        let mut symbols: Vec<&str> = Vec::new();
        for d in model.graph.inputs.iter().filter_map(|v| v.shape.as_ref()).flatten() {
            if let Dim::Symbol(s) = d
                && !symbols.contains(&s.as_str())
            {
                symbols.push(s);
            }
        }
        let [symbol] = symbols.as_slice() else { return None };
        let mut inferred = Vec::new();
        for b in PROBE_BATCHES {
            let mut m = model.clone();
            for d in m.graph.inputs.iter_mut().filter_map(|v| v.shape.as_mut()).flatten() {
                if matches!(d, Dim::Symbol(s) if s == symbol) {
                    *d = Dim::Fixed(b as usize);
                }
            }
            inferred.push(infer(&m.graph, m.opset()).ok()?);
        }
        let dims = |inf: &Inference, name: &str| -> Option<Vec<Option<i64>>> {
            Some(inf.types.get(name)?.shape.as_ref()?.iter().map(|d| d.fixed().map(|n| n as i64)).collect())
        };
        let [b0, b1, b2] = PROBE_BATCHES;
        let mut forms = HashMap::new();
        for name in inferred[0].types.keys() {
            let (Some(d0), Some(d1), Some(d2)) =
                (dims(&inferred[0], name), dims(&inferred[1], name), dims(&inferred[2], name))
            else {
                continue;
            };
            if d0.len() != d1.len() || d0.len() != d2.len() {
                continue;
            }
            let form = (0..d0.len())
                .map(|k| {
                    let (x0, x1, x2) = (d0[k]?, d1[k]?, d2[k]?);
                    let a = (x1 - x0) / (b1 - b0);
                    let c = x0 - a * b0;
                    (a * (b1 - b0) == x1 - x0 && a * b2 + c == x2).then_some((a, c))
                })
                .collect();
            forms.insert(name.clone(), form);
        }
        Some(BatchForms { symbol: symbol.to_string(), forms })
    }

    /// Dimension `axis` of `value`: fixed where it does not depend on the batch, else
    /// an ONNX `dim_param` expression of the batch (`4*batch`, `batch+1`), which tract
    /// reads as one and ONNX Runtime as a name.
    pub(crate) fn named(&self, value: &str, axis: usize) -> Option<Dim> {
        let (a, c) = self.dim(value, axis)?;
        let b = &self.symbol;
        let scaled = match a {
            0 => return usize::try_from(c).ok().map(Dim::Fixed),
            1 => b.clone(),
            a => format!("{a}*{b}"),
        };
        Some(Dim::Symbol(match c {
            0 => scaled,
            c if c > 0 => format!("{scaled}+{c}"),
            c => format!("{scaled}-{}", -c),
        }))
    }

    /// The form of dimension `axis` of `value`.
    pub(crate) fn dim(&self, value: &str, axis: usize) -> Option<(i64, i64)> {
        *self.forms.get(value)?.get(axis)?
    }
}
