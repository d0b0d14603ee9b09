//! Element types of ONNX tensors.

use crate::error::{GraphError, Result};
use tract_onnx::pb::tensor_proto::DataType as PbType;

/// The element type of a tensor, as ONNX numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataType {
    /// 32-bit IEEE float.
    Float32,
    /// 64-bit IEEE float.
    Float64,
    /// 16-bit IEEE float.
    Float16,
    /// bfloat16.
    BFloat16,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 8-bit integer.
    Uint8,
    /// Unsigned 16-bit integer.
    Uint16,
    /// Unsigned 32-bit integer.
    Uint32,
    /// Unsigned 64-bit integer.
    Uint64,
    /// Boolean, one byte per element.
    Bool,
    /// Byte strings.
    String,
}

impl DataType {
    /// Converts from the ONNX `TensorProto.DataType` number.
    pub fn from_onnx(code: i32) -> Result<DataType> {
        let pb = PbType::try_from(code).map_err(|_| GraphError::Invalid(format!("unknown data type code {code}")))?;
        Ok(match pb {
            PbType::Float => DataType::Float32,
            PbType::Double => DataType::Float64,
            PbType::Float16 => DataType::Float16,
            PbType::Bfloat16 => DataType::BFloat16,
            PbType::Int8 => DataType::Int8,
            PbType::Int16 => DataType::Int16,
            PbType::Int32 => DataType::Int32,
            PbType::Int64 => DataType::Int64,
            PbType::Uint8 => DataType::Uint8,
            PbType::Uint16 => DataType::Uint16,
            PbType::Uint32 => DataType::Uint32,
            PbType::Uint64 => DataType::Uint64,
            PbType::Bool => DataType::Bool,
            PbType::String => DataType::String,
            other => {
                return Err(GraphError::Invalid(format!("data type {} is not supported", other.as_str_name())));
            }
        })
    }

    /// The ONNX `TensorProto.DataType` number.
    pub fn to_onnx(self) -> i32 {
        let pb = match self {
            DataType::Float32 => PbType::Float,
            DataType::Float64 => PbType::Double,
            DataType::Float16 => PbType::Float16,
            DataType::BFloat16 => PbType::Bfloat16,
            DataType::Int8 => PbType::Int8,
            DataType::Int16 => PbType::Int16,
            DataType::Int32 => PbType::Int32,
            DataType::Int64 => PbType::Int64,
            DataType::Uint8 => PbType::Uint8,
            DataType::Uint16 => PbType::Uint16,
            DataType::Uint32 => PbType::Uint32,
            DataType::Uint64 => PbType::Uint64,
            DataType::Bool => PbType::Bool,
            DataType::String => PbType::String,
        };
        pb as i32
    }

    /// Bytes per element in ONNX's little-endian raw layout (0 for strings).
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Bool => 1,
            DataType::Float16 | DataType::BFloat16 | DataType::Int16 | DataType::Uint16 => 2,
            DataType::Float32 | DataType::Int32 | DataType::Uint32 => 4,
            DataType::Float64 | DataType::Int64 | DataType::Uint64 => 8,
            DataType::String => 0,
        }
    }

    /// Whether this is a floating-point type (the types parameters and gradients have).
    pub fn is_float(self) -> bool {
        matches!(self, DataType::Float32 | DataType::Float64 | DataType::Float16 | DataType::BFloat16)
    }

    /// Whether this is an integer type.
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::Uint8
                | DataType::Uint16
                | DataType::Uint32
                | DataType::Uint64
        )
    }

    /// Short lower-case name (`f32`, `i64`...).
    pub fn short_name(self) -> &'static str {
        match self {
            DataType::Float32 => "f32",
            DataType::Float64 => "f64",
            DataType::Float16 => "f16",
            DataType::BFloat16 => "bf16",
            DataType::Int8 => "i8",
            DataType::Int16 => "i16",
            DataType::Int32 => "i32",
            DataType::Int64 => "i64",
            DataType::Uint8 => "u8",
            DataType::Uint16 => "u16",
            DataType::Uint32 => "u32",
            DataType::Uint64 => "u64",
            DataType::Bool => "bool",
            DataType::String => "string",
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short_name())
    }
}
