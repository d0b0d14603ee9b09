//! The graph layer of edgefreeze: an ONNX graph IR and what every other part of the
//! toolchain needs to know about a model.
//!
//! Import goes in phases, each its own module: [`load`] parses the protobuf (and external
//! data), [`upgrade`] brings opsets 9 to 12 to 13, [`sort`] orders the nodes, [`sequence`] turns `torch.chunk`'s tensor sequences
//! into `Split`s, [`ops`] checks every op is supported, [`batch`] makes a batch of 1 fixed
//! in the file variable, [`fold`] folds
//! constant subgraphs, and [`infer`] gives every value a type and shape. [`save`] writes
//! the model back. [`analysis`] groups nodes into layers and finds the cut points that
//! freezing and device/edge partitioning act on.

pub mod analysis;
pub mod batch;
pub mod dtype;
pub mod einsum;
pub mod error;
pub mod exported;
pub mod fold;
pub mod infer;
pub mod ir;
pub mod load;
pub mod ops;
pub mod optimize;
pub mod save;
pub mod sequence;
pub mod sort;
pub mod tensor;
pub mod text_inputs;
pub mod untie;
pub mod upgrade;

pub use analysis::{Analysis, Cut, Layer, analyse};
pub use dtype::DataType;
pub use error::{GraphError, Result};
pub use ir::{Attribute, Dim, Graph, Model, Node, Shape, ValueInfo};
pub use load::{load_model, parse_model};
pub use save::{SaveOptions, save_model};
pub use tensor::Tensor;

use std::path::Path;

/// Loads an ONNX file and prepares it for the rest of the toolchain: parse, sort, check
/// opset and ops (every unsupported op reported at once), fold constants, infer shapes.
///
/// Every error names the file, and the node where there is one.
pub fn import(path: impl AsRef<Path>) -> Result<Model> {
    let path = path.as_ref();
    let model = load_model(path)?;
    prepare(model).map_err(|e| e.in_file(path))
}

/// Runs the import phases after parsing on an in-memory model.
pub fn prepare(mut model: Model) -> Result<Model> {
    let softmax = upgrade::upgrade_opset(&mut model)?;
    ops::check_opset(&model.opset_imports)?;
    sort::sort_topologically(&mut model.graph)?;
    sequence::rewrite_sequences(&mut model)?;
    ops::check_supported(&model.graph)?;
    exported::constant_buffers(&mut model);
    batch::relax_fixed_batch(&mut model)?;
    upgrade::coerced_softmax(&mut model, &softmax)?;
    untie::untie_identity_initializers(&mut model.graph);
    fold::fold_constants(&mut model)?;
    infer::constant_scales_for_symbolic_sizes(&mut model)?;
    record_types(&mut model)?;
    Ok(model)
}

/// Infers the types of all values and records them in the graph's `value_info` and, where
/// missing, on its outputs.
pub fn record_types(model: &mut Model) -> Result<()> {
    let inference = infer::infer(&model.graph, model.opset())?;
    let graph = &mut model.graph;
    let outputs: std::collections::HashSet<String> = graph.outputs.iter().map(|v| v.name.clone()).collect();
    for out in &mut graph.outputs {
        if let Some(t) = inference.types.get(&out.name)
            && (out.shape.is_none() || out.dtype.is_none())
        {
            out.dtype = out.dtype.or(t.dtype);
            out.shape = out.shape.clone().or(t.shape.clone());
        }
    }
    graph.value_info.clear();
    for node in &graph.nodes {
        for name in node.outputs.iter().filter(|o| !o.is_empty() && !outputs.contains(*o)) {
            if let Some(t) = inference.types.get(name) {
                graph.value_info.insert(name.clone(), t.clone());
            }
        }
    }
    Ok(())
}
