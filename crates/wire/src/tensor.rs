//! Tensors on the wire: row-major elements as raw little-endian bytes, with a dtype and
//! a shape. Decoding checks everything a peer could get wrong — an unknown dtype, a rank
//! or element count over the limits, a byte length that is not elements × dtype size,
//! booleans other than 0 and 1 — and names the tensor in the error. Shapes are checked
//! against the [`PortSpec`] a session announced with [`check_port`].

use crate::pb::{self, Dtype, PortSpec};
use crate::{Limits, WireError};

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> Option<usize> {
        match self {
            Dtype::Unspecified => None,
            Dtype::F32 => Some(4),
            Dtype::F64 | Dtype::I64 => Some(8),
            Dtype::Bool => Some(1),
        }
    }
}

/// A tensor whose header has been checked: known dtype, shape within the limits and a
/// byte length that matches.
#[derive(Debug, Clone, Copy)]
pub struct Checked<'a> {
    /// The element type.
    pub dtype: Dtype,
    /// Elements in row-major order, little-endian.
    pub data: &'a [u8],
    shape: &'a [u64],
}

impl Checked<'_> {
    /// The shape as `usize`s (each dimension fits: the element count was checked).
    pub fn shape(&self) -> Vec<usize> {
        self.shape.iter().map(|&d| d as usize).collect()
    }

    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.data.len() / self.dtype.size().unwrap_or(1)
    }
}

/// Checks a tensor's dtype, rank, element count and byte length. `name` names it in errors.
pub fn check<'a>(name: &str, tensor: &'a pb::Tensor, limits: &Limits) -> Result<Checked<'a>, WireError> {
    let dtype = Dtype::try_from(tensor.dtype)
        .map_err(|_| WireError::tensor(name, format!("unknown dtype {}", tensor.dtype)))?;
    let size = dtype.size().ok_or_else(|| WireError::tensor(name, "dtype not set"))?;
    if tensor.shape.len() > limits.max_rank {
        return Err(WireError::tensor(
            name,
            format!("rank {} is over the limit {}", tensor.shape.len(), limits.max_rank),
        ));
    }
    let mut elements: u64 = 1;
    for &d in &tensor.shape {
        elements = elements
            .checked_mul(d)
            .ok_or_else(|| WireError::tensor(name, format!("shape {:?} overflows", tensor.shape)))?;
    }
    if elements > limits.max_elements as u64 {
        return Err(WireError::tensor(
            name,
            format!("shape {:?} has {elements} elements, over the limit {}", tensor.shape, limits.max_elements),
        ));
    }
    let expected = elements as usize * size;
    if tensor.data.len() != expected {
        return Err(WireError::tensor(
            name,
            format!(
                "{} data bytes, but shape {:?} of {} needs {expected}",
                tensor.data.len(),
                tensor.shape,
                dtype.as_str_name()
            ),
        ));
    }
    if dtype == Dtype::Bool && tensor.data.iter().any(|&b| b > 1) {
        return Err(WireError::tensor(name, "a boolean element is neither 0 nor 1"));
    }
    Ok(Checked { dtype, data: &tensor.data, shape: &tensor.shape })
}

/// Checks a tensor against a port: same dtype, same rank, the same fixed dimensions, and
/// at least one sample along a batch (negative) dimension. Returns the batch size (1
/// where the port has no batch dimension).
pub fn check_port(tensor: &Checked<'_>, port: &PortSpec) -> Result<usize, WireError> {
    let name = &port.name;
    if tensor.dtype as i32 != port.dtype {
        let want = Dtype::try_from(port.dtype).map(|d| d.as_str_name()).unwrap_or("an unknown dtype");
        return Err(WireError::tensor(
            name,
            format!("dtype {} where the session expects {want}", tensor.dtype.as_str_name()),
        ));
    }
    let shape = tensor.shape();
    let mismatch =
        || WireError::tensor(name, format!("shape {shape:?} where the session expects {}", describe_dims(&port.dims)));
    if shape.len() != port.dims.len() {
        return Err(mismatch());
    }
    // The batch is the first free axis (a later one, a size the model leaves open such as
    // a segmentation map's height, is not the sample count).
    let mut batch = None;
    for (&got, &want) in shape.iter().zip(&port.dims) {
        if want < 0 {
            if got == 0 {
                return Err(WireError::tensor(name, "an empty batch"));
            }
            batch = batch.or(Some(got));
        } else if got as i64 != want {
            return Err(mismatch());
        }
    }
    Ok(batch.unwrap_or(1))
}

/// `batch×16×28×28` for dims `[-1, 16, 28, 28]`.
pub fn describe_dims(dims: &[i64]) -> String {
    if dims.is_empty() {
        return "a scalar".to_string();
    }
    dims.iter().map(|&d| if d < 0 { "batch".to_string() } else { d.to_string() }).collect::<Vec<_>>().join("×")
}

/// Element types that travel as little-endian bytes.
pub trait Element: Copy {
    /// The wire dtype.
    const DTYPE: Dtype;
    /// Appends the element's little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
    /// Reads one element from exactly `size()` bytes.
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $dtype:expr, $n:expr) => {
        impl Element for $t {
            const DTYPE: Dtype = $dtype;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                let mut b = [0u8; $n];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
    };
}
element!(f32, Dtype::F32, 4);
element!(f64, Dtype::F64, 8);
element!(i64, Dtype::I64, 8);

impl Element for bool {
    const DTYPE: Dtype = Dtype::Bool;
    fn put(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn get(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

/// Encodes elements of a shape (`values.len()` must be the shape's element count).
pub fn encode<T: Element>(shape: &[usize], values: &[T]) -> Result<pb::Tensor, WireError> {
    let elements: usize = shape.iter().product();
    if elements != values.len() {
        return Err(WireError::tensor("(encoding)", format!("{} values for shape {shape:?}", values.len())));
    }
    Ok(encode_elements(shape, values.iter().copied()))
}

/// Encodes elements whose count is the shape's (the callers guarantee it).
fn encode_elements<T: Element>(shape: &[usize], values: impl ExactSizeIterator<Item = T>) -> pb::Tensor {
    let mut data = Vec::with_capacity(values.len() * T::DTYPE.size().unwrap_or(1));
    for v in values {
        v.put(&mut data);
    }
    pb::Tensor { dtype: T::DTYPE as i32, shape: shape.iter().map(|&d| d as u64).collect(), data }
}

/// Decodes a checked tensor's elements, which must be of type `T`.
pub fn decode<T: Element>(name: &str, tensor: &Checked<'_>) -> Result<Vec<T>, WireError> {
    if tensor.dtype != T::DTYPE {
        return Err(WireError::tensor(
            name,
            format!("dtype {} where {} was expected", tensor.dtype.as_str_name(), T::DTYPE.as_str_name()),
        ));
    }
    let size = T::DTYPE.size().unwrap_or(1);
    Ok(tensor.data.chunks_exact(size).map(T::get).collect())
}

/// Bytes a tensor's elements take (what a session's state is measured in).
pub fn data_bytes(tensor: &pb::Tensor) -> usize {
    tensor.data.len()
}

#[cfg(feature = "engine")]
mod engine {
    use super::*;
    use edgefreeze_engine::Value;
    use ndarray::ArrayD;

    /// Encodes an engine value.
    pub fn from_value(value: &Value) -> pb::Tensor {
        fn of<T: Element>(a: &ArrayD<T>) -> pb::Tensor {
            encode_elements(a.shape(), a.iter().copied())
        }
        match value {
            Value::F32(a) => of(a),
            Value::F64(a) => of(a),
            Value::I64(a) => of(a),
            Value::Bool(a) => of(a),
        }
    }

    /// Decodes a tensor into an engine value after [`check`]ing it.
    pub fn to_value(name: &str, tensor: &pb::Tensor, limits: &Limits) -> Result<Value, WireError> {
        let checked = check(name, tensor, limits)?;
        checked_to_value(name, &checked)
    }

    /// Decodes an already checked tensor into an engine value.
    pub fn checked_to_value(name: &str, tensor: &Checked<'_>) -> Result<Value, WireError> {
        fn array<T: Element>(name: &str, t: &Checked<'_>) -> Result<ArrayD<T>, WireError> {
            ArrayD::from_shape_vec(t.shape(), decode(name, t)?).map_err(|e| WireError::tensor(name, e.to_string()))
        }
        Ok(match tensor.dtype {
            Dtype::F32 => Value::F32(array(name, tensor)?),
            Dtype::F64 => Value::F64(array(name, tensor)?),
            Dtype::I64 => Value::I64(array(name, tensor)?),
            Dtype::Bool => Value::Bool(array(name, tensor)?),
            Dtype::Unspecified => return Err(WireError::tensor(name, "dtype not set")),
        })
    }

    /// The wire dtype of an engine value.
    pub fn dtype_of(value: &Value) -> Dtype {
        match value {
            Value::F32(_) => Dtype::F32,
            Value::F64(_) => Dtype::F64,
            Value::I64(_) => Dtype::I64,
            Value::Bool(_) => Dtype::Bool,
        }
    }
}

#[cfg(feature = "engine")]
pub use engine::{checked_to_value, dtype_of, from_value, to_value};

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { max_message_bytes: 1 << 20, max_rank: 4, max_elements: 1000 }
    }

    #[test]
    fn round_trips_every_dtype() {
        let f = encode(&[2, 3], &[1.5f32, -0.0, f32::MIN_POSITIVE, f32::MAX, f32::INFINITY, -2.25]).unwrap();
        assert_eq!(f.data.len(), 24);
        assert_eq!(&f.data[..4], &1.5f32.to_le_bytes());
        let c = check("f", &f, &limits()).unwrap();
        assert_eq!(c.shape(), vec![2, 3]);
        let back: Vec<f32> = decode("f", &c).unwrap();
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            [1.5f32, -0.0, f32::MIN_POSITIVE, f32::MAX, f32::INFINITY, -2.25].map(f32::to_bits)
        );

        let i = encode(&[3], &[i64::MIN, 0, 7]).unwrap();
        assert_eq!(decode::<i64>("i", &check("i", &i, &limits()).unwrap()).unwrap(), vec![i64::MIN, 0, 7]);
        let d = encode(&[], &[std::f64::consts::PI]).unwrap();
        assert_eq!(decode::<f64>("d", &check("d", &d, &limits()).unwrap()).unwrap(), vec![std::f64::consts::PI]);
        let b = encode(&[2], &[true, false]).unwrap();
        assert_eq!(decode::<bool>("b", &check("b", &b, &limits()).unwrap()).unwrap(), vec![true, false]);
    }

    #[test]
    fn rejects_malformed_tensors() {
        let good = encode(&[2, 2], &[1f32, 2., 3., 4.]).unwrap();
        let err = |t: &pb::Tensor| check("activation", t, &limits()).unwrap_err().to_string();

        let short = pb::Tensor { data: good.data[..15].to_vec(), ..good.clone() };
        assert!(err(&short).contains("15 data bytes, but shape [2, 2] of DTYPE_F32 needs 16"), "{}", err(&short));
        let unknown = pb::Tensor { dtype: 99, ..good.clone() };
        assert!(err(&unknown).contains("unknown dtype 99"));
        let unset = pb::Tensor { dtype: 0, ..good.clone() };
        assert!(err(&unset).contains("dtype not set"));
        let deep = pb::Tensor { shape: vec![1; 5], data: good.data[..4].to_vec(), ..good.clone() };
        assert!(err(&deep).contains("rank 5 is over the limit 4"));
        let big = pb::Tensor { shape: vec![1001], ..good.clone() };
        assert!(err(&big).contains("over the limit 1000"));
        let overflow = pb::Tensor { shape: vec![u64::MAX, 3], ..good.clone() };
        assert!(err(&overflow).contains("overflows"));
        let bad_bool = pb::Tensor { dtype: Dtype::Bool as i32, shape: vec![1], data: vec![2] };
        assert!(err(&bad_bool).contains("neither 0 nor 1"));
        assert!(err(&short).starts_with("tensor activation:"));

        let c = check("activation", &good, &limits()).unwrap();
        assert!(decode::<i64>("activation", &c).unwrap_err().to_string().contains("DTYPE_F32 where DTYPE_I64"));
        assert!(encode(&[3], &[1f32]).is_err());
    }

    #[test]
    fn checks_tensors_against_ports() {
        let port = PortSpec { name: "activation".into(), dtype: Dtype::F32 as i32, dims: vec![-1, 2] };
        let t = encode(&[3, 2], &[0f32; 6]).unwrap();
        assert_eq!(check_port(&check("a", &t, &limits()).unwrap(), &port).unwrap(), 3);

        let wrong_dim = encode(&[2, 3], &[0f32; 6]).unwrap();
        let e = check_port(&check("a", &wrong_dim, &limits()).unwrap(), &port).unwrap_err().to_string();
        assert!(e.contains("shape [2, 3] where the session expects batch×2"), "{e}");
        let wrong_rank = encode(&[6], &[0f32; 6]).unwrap();
        assert!(check_port(&check("a", &wrong_rank, &limits()).unwrap(), &port).is_err());
        let wrong_type = encode(&[3, 2], &[0i64; 6]).unwrap();
        let e = check_port(&check("a", &wrong_type, &limits()).unwrap(), &port).unwrap_err().to_string();
        assert!(e.contains("dtype DTYPE_I64 where the session expects DTYPE_F32"), "{e}");
        let empty = encode::<f32>(&[0, 2], &[]).unwrap();
        assert!(
            check_port(&check("a", &empty, &limits()).unwrap(), &port).unwrap_err().to_string().contains("empty batch")
        );
    }
}
