//! Dense tensors with their data held as ONNX's little-endian raw bytes.

use crate::dtype::DataType;
use crate::error::{GraphError, Result};

/// A dense tensor: element type, dimensions and data.
///
/// Numeric data is kept as ONNX's little-endian raw bytes, whatever field of the
/// `TensorProto` it came from, so that saving is lossless and cheap.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    dtype: DataType,
    dims: Vec<usize>,
    data: TensorData,
}

#[derive(Debug, Clone, PartialEq)]
enum TensorData {
    Raw(Vec<u8>),
    Strings(Vec<Vec<u8>>),
}

impl Tensor {
    /// A tensor from raw little-endian bytes; the length must match the dimensions.
    pub fn from_raw(dtype: DataType, dims: Vec<usize>, bytes: Vec<u8>) -> Result<Tensor> {
        if dtype == DataType::String {
            return Err(GraphError::Invalid("string tensors cannot be built from raw bytes".into()));
        }
        let expected = checked_numel(&dims).and_then(|n| n.checked_mul(dtype.size()));
        if expected != Some(bytes.len()) {
            let expected = expected.map_or("more than addressable".to_string(), |n| n.to_string());
            return Err(GraphError::Invalid(format!(
                "{dtype} tensor of shape {dims:?} needs {expected} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(Tensor { dtype, dims, data: TensorData::Raw(bytes) })
    }

    /// A string tensor.
    pub fn from_strings(dims: Vec<usize>, strings: Vec<Vec<u8>>) -> Result<Tensor> {
        if checked_numel(&dims) != Some(strings.len()) {
            let expected = checked_numel(&dims).map_or("too many".to_string(), |n| n.to_string());
            return Err(GraphError::Invalid(format!(
                "string tensor of shape {dims:?} needs {expected} elements, got {}",
                strings.len()
            )));
        }
        Ok(Tensor { dtype: DataType::String, dims, data: TensorData::Strings(strings) })
    }

    /// An f32 tensor.
    pub fn from_f32(dims: Vec<usize>, values: &[f32]) -> Result<Tensor> {
        Tensor::from_raw(DataType::Float32, dims, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// An i64 tensor.
    pub fn from_i64(dims: Vec<usize>, values: &[i64]) -> Result<Tensor> {
        Tensor::from_raw(DataType::Int64, dims, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// A tensor of any numeric type from f64 values (rounded or truncated as a cast would).
    pub fn from_f64_as(dtype: DataType, dims: Vec<usize>, values: &[f64]) -> Result<Tensor> {
        let mut bytes = Vec::with_capacity(values.len() * dtype.size());
        for &v in values {
            match dtype {
                DataType::Float32 => bytes.extend((v as f32).to_le_bytes()),
                DataType::Float64 => bytes.extend(v.to_le_bytes()),
                DataType::Float16 => bytes.extend(f32_to_f16_bits(v as f32).to_le_bytes()),
                DataType::BFloat16 => bytes.extend(((v as f32).to_bits() >> 16).to_le_bytes()[..2].iter()),
                _ => return Tensor::from_i64_as(dtype, dims, &values.iter().map(|&x| x as i64).collect::<Vec<_>>()),
            }
        }
        Tensor::from_raw(dtype, dims, bytes)
    }

    /// A tensor of any numeric or boolean type from i64 values.
    pub fn from_i64_as(dtype: DataType, dims: Vec<usize>, values: &[i64]) -> Result<Tensor> {
        let mut bytes = Vec::with_capacity(values.len() * dtype.size());
        for &v in values {
            match dtype {
                DataType::Int8 => bytes.push(v as i8 as u8),
                DataType::Uint8 => bytes.push(v as u8),
                DataType::Bool => bytes.push((v != 0) as u8),
                DataType::Int16 => bytes.extend((v as i16).to_le_bytes()),
                DataType::Uint16 => bytes.extend((v as u16).to_le_bytes()),
                DataType::Int32 => bytes.extend((v as i32).to_le_bytes()),
                DataType::Uint32 => bytes.extend((v as u32).to_le_bytes()),
                DataType::Int64 => bytes.extend(v.to_le_bytes()),
                DataType::Uint64 => bytes.extend((v as u64).to_le_bytes()),
                DataType::String => {
                    return Err(GraphError::Invalid("cannot build a string tensor from numbers".into()));
                }
                _ => {
                    return Tensor::from_f64_as(dtype, dims, &values.iter().map(|&x| x as f64).collect::<Vec<_>>());
                }
            }
        }
        Tensor::from_raw(dtype, dims, bytes)
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// The raw little-endian bytes (empty for string tensors).
    pub fn raw_bytes(&self) -> &[u8] {
        match &self.data {
            TensorData::Raw(bytes) => bytes,
            TensorData::Strings(_) => &[],
        }
    }

    /// The strings of a string tensor.
    pub fn strings(&self) -> Option<&[Vec<u8>]> {
        match &self.data {
            TensorData::Strings(s) => Some(s),
            TensorData::Raw(_) => None,
        }
    }

    /// The same data under other dimensions with the same element count.
    pub fn reshaped(&self, dims: Vec<usize>) -> Result<Tensor> {
        if checked_numel(&dims) != Some(self.numel()) {
            return Err(GraphError::Invalid(format!("cannot reshape {:?} to {dims:?}", self.dims)));
        }
        Ok(Tensor { dtype: self.dtype, dims, data: self.data.clone() })
    }

    /// All elements as f64 (None for strings).
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        let b = self.raw_bytes();
        Some(match self.dtype {
            DataType::Float32 => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            DataType::Float64 => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
            DataType::Float16 => {
                b.chunks_exact(2).map(|c| f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64).collect()
            }
            DataType::BFloat16 => b
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64)
                .collect(),
            DataType::String => return None,
            _ => self.to_i64_vec()?.into_iter().map(|v| v as f64).collect(),
        })
    }

    /// All elements as f32 (None for strings).
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        if self.dtype == DataType::Float32 {
            return Some(self.raw_bytes().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect());
        }
        Some(self.to_f64_vec()?.into_iter().map(|v| v as f32).collect())
    }

    /// All elements as i64: integer and boolean tensors only.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        let b = self.raw_bytes();
        Some(match self.dtype {
            DataType::Int8 => b.iter().map(|&x| x as i8 as i64).collect(),
            DataType::Uint8 | DataType::Bool => b.iter().map(|&x| x as i64).collect(),
            DataType::Int16 => b.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            DataType::Uint16 => b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            DataType::Int32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
            DataType::Uint32 => b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
            DataType::Int64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            DataType::Uint64 => b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
            _ => return None,
        })
    }
}

/// The element count of a shape, or `None` when it overflows.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Converts IEEE half-precision bits to f32.
pub(crate) fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) & 1) as u32;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if frac == 0 {
            sign << 31
        } else {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut f = frac;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            (sign << 31) | ((e as u32) << 23) | ((f & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        (sign << 31) | (0xff << 23) | (frac << 13)
    } else {
        (sign << 31) | ((exp + 127 - 15) << 23) | (frac << 13)
    };
    f32::from_bits(bits)
}

/// Converts f32 to IEEE half-precision bits (round to nearest even).
pub(crate) fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let frac = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if frac != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let f = frac | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = f >> shift;
        let rem = f & ((1 << shift) - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (frac >> 13);
    let rem = frac & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_length_must_match_dims() {
        assert!(Tensor::from_raw(DataType::Float32, vec![2, 3], vec![0; 23]).is_err());
        assert!(Tensor::from_raw(DataType::Float32, vec![2, 3], vec![0; 24]).is_ok());
    }

    #[test]
    fn numbers_survive_conversion_through_every_type() {
        for dtype in [DataType::Int8, DataType::Int32, DataType::Int64, DataType::Uint16, DataType::Float32] {
            let t = Tensor::from_i64_as(dtype, vec![3], &[-1, 0, 7]).unwrap();
            let expected = if dtype == DataType::Uint16 { vec![65535.0, 0.0, 7.0] } else { vec![-1.0, 0.0, 7.0] };
            assert_eq!(t.to_f64_vec().unwrap(), expected, "{dtype}");
        }
    }

    #[test]
    fn half_precision_round_trips_representable_values() {
        for v in [0.0f32, -0.0, 1.0, -2.5, 65504.0, 6.1035156e-5, 5.9604645e-8, f32::INFINITY] {
            assert_eq!(f16_bits_to_f32(f32_to_f16_bits(v)).to_bits(), v.to_bits(), "{v}");
        }
        assert!(f16_bits_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
    }
}
