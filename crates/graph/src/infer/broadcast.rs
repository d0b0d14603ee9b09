//! NumPy-style broadcasting of shapes with symbolic dimensions, and of concrete indices.

use crate::ir::{Dim, Shape};

/// Broadcasts shapes as ONNX's multidirectional broadcasting does.
/// Returns `None` when two fixed dimensions disagree.
pub fn broadcast_shapes(shapes: &[&[Dim]]) -> Option<Shape> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(rank);
    for axis in 0..rank {
        let mut dim = Dim::Fixed(1);
        for s in shapes {
            let offset = rank - s.len();
            if axis < offset {
                continue;
            }
            dim = merge_dims(&dim, &s[axis - offset])?;
        }
        out.push(dim);
    }
    Some(out)
}

/// Two dimensions broadcast together (`None` when two known sizes disagree and neither is 1).
pub fn merge_dims(a: &Dim, b: &Dim) -> Option<Dim> {
    Some(match (a, b) {
        (Dim::Fixed(1), other) | (other, Dim::Fixed(1)) => other.clone(),
        (Dim::Fixed(x), Dim::Fixed(y)) if x == y => Dim::Fixed(*x),
        (Dim::Fixed(_), Dim::Fixed(_)) => return None,
        (Dim::Fixed(n), _) | (_, Dim::Fixed(n)) => Dim::Fixed(*n),
        (Dim::Symbol(x), Dim::Symbol(y)) if x == y => Dim::Symbol(x.clone()),
        (Dim::Symbol(x), Dim::Unknown) | (Dim::Unknown, Dim::Symbol(x)) => Dim::Symbol(x.clone()),
        _ => Dim::Unknown,
    })
}

/// Broadcasts concrete dimensions.
pub fn broadcast_dims(dims: &[&[usize]]) -> Option<Vec<usize>> {
    let shapes: Vec<Shape> = dims.iter().map(|d| d.iter().map(|&n| Dim::Fixed(n)).collect()).collect();
    let refs: Vec<&[Dim]> = shapes.iter().map(|s| s.as_slice()).collect();
    broadcast_shapes(&refs).map(|s| s.into_iter().map(|d| d.fixed().unwrap_or(0)).collect())
}

/// For each element of `out_dims` (row-major), the index of the element of a tensor of
/// `in_dims` that broadcasting reads.
pub fn broadcast_index_map(in_dims: &[usize], out_dims: &[usize]) -> Vec<usize> {
    let rank = out_dims.len();
    let offset = rank - in_dims.len();
    let mut in_strides = vec![0usize; rank];
    let mut stride = 1;
    for axis in (0..in_dims.len()).rev() {
        in_strides[axis + offset] = if in_dims[axis] == 1 { 0 } else { stride };
        stride *= in_dims[axis];
    }
    let total: usize = out_dims.iter().product();
    let mut map = Vec::with_capacity(total);
    let mut index = vec![0usize; rank];
    for _ in 0..total {
        map.push(index.iter().zip(&in_strides).map(|(i, s)| i * s).sum());
        for axis in (0..rank).rev() {
            index[axis] += 1;
            if index[axis] < out_dims[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolic_batch_broadcasts_against_one() {
        let a = vec![Dim::Symbol("batch".into()), Dim::Fixed(3)];
        let b = vec![Dim::Fixed(3)];
        assert_eq!(broadcast_shapes(&[&a, &b]).unwrap(), a);
        assert!(broadcast_shapes(&[&[Dim::Fixed(2)], &[Dim::Fixed(3)]]).is_none());
    }

    #[test]
    fn index_map_repeats_broadcast_axes() {
        assert_eq!(broadcast_index_map(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_index_map(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
    }
}
