//! `Einsum` equations: parsing, the sizes each subscript binds to, and the output shape.
//!
//! The op table's shape and FLOP rules and the autodiff crate's gradient rule all read an
//! equation through [`Equation`], so the subscript grammar lives in one place.

use crate::error::GraphError;
use crate::infer::{broadcast_shapes, merge_dims};
use crate::ir::{Dim, Node, Shape, format_shape};
use std::collections::BTreeMap;
use std::fmt;

/// One subscript of an Einsum term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// A named axis (`a`-`z`, `A`-`Z`).
    Letter(char),
    /// `...`: the leading axes not named by letters, broadcast across operands.
    Ellipsis,
}

/// A parsed Einsum equation: one term per input and the output term (explicit, or the
/// implicit one ONNX defines: the ellipsis, then every letter used exactly once, in
/// alphabetical order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Equation {
    /// The subscripts of each input, in order.
    pub inputs: Vec<Vec<Label>>,
    /// The subscripts of the output.
    pub output: Vec<Label>,
}

/// The sizes an equation binds for given operand shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The size of each letter.
    pub letters: BTreeMap<char, Dim>,
    /// The broadcast dimensions the ellipsis stands for (empty without one).
    pub ellipsis: Shape,
}

impl Equation {
    /// Parses an equation (whitespace is ignored, as exporters write `"b h i d, b h j d -> b h i j"`).
    pub fn parse(text: &str) -> Result<Equation, String> {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match compact.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (compact.as_str(), None),
        };
        let inputs = lhs.split(',').map(parse_term).collect::<Result<Vec<_>, _>>()?;
        let output = match rhs {
            Some(r) => {
                let out = parse_term(r)?;
                for (k, l) in out.iter().enumerate() {
                    if out[..k].contains(l) {
                        return Err(format!("the output repeats the subscript {}", label_text(*l)));
                    }
                    let in_inputs = inputs.iter().any(|t| t.contains(l));
                    match l {
                        Label::Letter(c) if !in_inputs => {
                            return Err(format!("the output subscript {c} appears in no input"));
                        }
                        Label::Ellipsis if !in_inputs => return Err("the output has an ellipsis, no input has".into()),
                        _ => {}
                    }
                }
                if inputs.iter().any(|t| t.contains(&Label::Ellipsis)) && !out.contains(&Label::Ellipsis) {
                    return Err("an ellipsis in the inputs must also be in the output".into());
                }
                out
            }
            None => {
                let mut counts: BTreeMap<char, usize> = BTreeMap::new();
                for l in inputs.iter().flatten() {
                    if let Label::Letter(c) = l {
                        *counts.entry(*c).or_default() += 1;
                    }
                }
                let ellipsis = inputs.iter().any(|t| t.contains(&Label::Ellipsis));
                let once = counts.into_iter().filter(|(_, n)| *n == 1).map(|(c, _)| Label::Letter(c));
                ellipsis.then_some(Label::Ellipsis).into_iter().chain(once).collect()
            }
        };
        Ok(Equation { inputs, output })
    }

    /// The parsed `equation` attribute of an `Einsum` node; errors name the node.
    pub fn of_node(node: &Node) -> crate::Result<Equation> {
        let text = node.attr_string("equation", "")?;
        if text.is_empty() {
            return Err(GraphError::node(node, "Einsum needs an \"equation\" attribute"));
        }
        Equation::parse(&text).map_err(|e| GraphError::node(node, format!("equation {text:?}: {e}")))
    }

    /// Whether any term has an ellipsis.
    pub fn has_ellipsis(&self) -> bool {
        self.output.contains(&Label::Ellipsis) || self.inputs.iter().any(|t| t.contains(&Label::Ellipsis))
    }

    /// Binds each letter to its size and the ellipsis to its broadcast dimensions.
    pub fn bind(&self, shapes: &[&[Dim]]) -> Result<Bound, String> {
        if shapes.len() != self.inputs.len() {
            return Err(format!("the equation has {} inputs, the node {}", self.inputs.len(), shapes.len()));
        }
        let mut letters: BTreeMap<char, Dim> = BTreeMap::new();
        let mut ellipses: Vec<&[Dim]> = Vec::new();
        for (i, (term, shape)) in self.inputs.iter().zip(shapes).enumerate() {
            let named = term.iter().filter(|l| **l != Label::Ellipsis).count();
            let has_ellipsis = term.contains(&Label::Ellipsis);
            if shape.len() < named || (!has_ellipsis && shape.len() != named) {
                return Err(format!(
                    "input {i} has shape {} but its term {} names {named} axes",
                    format_shape(shape),
                    term_text(term)
                ));
            }
            let spread = shape.len() - named;
            let mut axis = 0;
            for l in term {
                match l {
                    Label::Ellipsis => {
                        ellipses.push(&shape[axis..axis + spread]);
                        axis += spread;
                    }
                    Label::Letter(c) => {
                        let d = &shape[axis];
                        let merged = match letters.get(c) {
                            None => d.clone(),
                            Some(old) => same_size(old, d).ok_or_else(|| {
                                format!("subscript {c} has size {old} in one place and {d} in another")
                            })?,
                        };
                        letters.insert(*c, merged);
                        axis += 1;
                    }
                }
            }
        }
        if ellipses.windows(2).any(|w| w[0].len() != w[1].len()) {
            let ranks: Vec<usize> = ellipses.iter().map(|e| e.len()).collect();
            return Err(format!(
                "the ellipses stand for {ranks:?} dimensions; ONNX requires the same number in every input"
            ));
        }
        let ellipsis = broadcast_shapes(&ellipses).ok_or("the dimensions under the ellipses do not broadcast")?;
        Ok(Bound { letters, ellipsis })
    }

    /// The dimensions of a term under a binding.
    pub fn dims_of(term: &[Label], bound: &Bound) -> Shape {
        let mut dims = Vec::new();
        for l in term {
            match l {
                Label::Ellipsis => dims.extend(bound.ellipsis.iter().cloned()),
                Label::Letter(c) => dims.push(bound.letters.get(c).cloned().unwrap_or(Dim::Unknown)),
            }
        }
        dims
    }

    /// The output shape for given operand shapes.
    pub fn output_shape(&self, shapes: &[&[Dim]]) -> Result<Shape, String> {
        let bound = self.bind(shapes)?;
        Ok(Equation::dims_of(&self.output, &bound))
    }
}

impl fmt::Display for Equation {
    /// The equation in ONNX's syntax, without whitespace and with an explicit output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inputs: Vec<String> = self.inputs.iter().map(|t| term_text(t)).collect();
        write!(f, "{}->{}", inputs.join(","), term_text(&self.output))
    }
}

/// A term in ONNX's syntax.
pub fn term_text(term: &[Label]) -> String {
    term.iter().map(|l| label_text(*l)).collect()
}

fn label_text(l: Label) -> String {
    match l {
        Label::Letter(c) => c.to_string(),
        Label::Ellipsis => "...".into(),
    }
}

fn parse_term(text: &str) -> Result<Vec<Label>, String> {
    let mut labels = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("...") {
            if labels.contains(&Label::Ellipsis) {
                return Err(format!("the term {text:?} has two ellipses"));
            }
            labels.push(Label::Ellipsis);
            rest = after;
        } else if c.is_ascii_alphabetic() {
            labels.push(Label::Letter(c));
            rest = &rest[1..];
        } else {
            return Err(format!("the term {text:?} has {c:?}, not a letter or \"...\""));
        }
    }
    Ok(labels)
}

/// The size of one subscript seen twice: known sizes must agree (a subscript does not
/// broadcast); otherwise the better known of the two, as broadcasting merges them.
fn same_size(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) if x != y => None,
        _ => merge_dims(a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Label::{Ellipsis, Letter};

    fn fixed(d: &[usize]) -> Shape {
        d.iter().map(|&n| Dim::Fixed(n)).collect()
    }

    #[test]
    fn parses_what_exporters_write() {
        let e = Equation::parse("B G H I D, B G H J D -> B G H I J").unwrap();
        assert_eq!(e.to_string(), "BGHID,BGHJD->BGHIJ");
        let e = Equation::parse("...ij,...jk").unwrap();
        assert_eq!(e.output, vec![Ellipsis, Letter('i'), Letter('k')]);
        assert_eq!(Equation::parse("ii").unwrap().output, vec![]);
        assert_eq!(Equation::parse("ba,ca").unwrap().to_string(), "ba,ca->bc");
    }

    #[test]
    fn rejects_bad_equations() {
        for (eq, why) in [
            ("ij->ii", "repeats"),
            ("ij->k", "appears in no input"),
            ("i.j", "not a letter"),
            ("......i", "two ellipses"),
            ("...i->i", "must also be in the output"),
            ("ij->...", "no input has"),
        ] {
            let err = Equation::parse(eq).unwrap_err();
            assert!(err.contains(why), "{eq}: {err}");
        }
    }

    #[test]
    fn binds_sizes_and_broadcasts_ellipses() {
        let e = Equation::parse("...ij,...jk->...ik").unwrap();
        let (a, b) = (fixed(&[5, 1, 2, 3]), fixed(&[1, 4, 3, 6]));
        assert_eq!(e.output_shape(&[&a, &b]).unwrap(), fixed(&[5, 4, 2, 6]));
        let ranks = e.output_shape(&[&a, &fixed(&[4, 3, 6])]).unwrap_err();
        assert!(ranks.contains("same number"), "{ranks}");
        let batch = vec![Dim::Symbol("n".into()), Dim::Fixed(2), Dim::Fixed(3)];
        let e = Equation::parse("bij,jk->bik").unwrap();
        assert_eq!(e.output_shape(&[&batch, &fixed(&[3, 4])]).unwrap()[0], Dim::Symbol("n".into()));
        let mismatch = e.output_shape(&[&batch, &fixed(&[2, 4])]).unwrap_err();
        assert!(mismatch.contains("subscript j"), "{mismatch}");
        let rank = e.output_shape(&[&fixed(&[2, 3]), &fixed(&[3, 4])]).unwrap_err();
        assert!(rank.contains("names 3 axes"), "{rank}");
    }
}
