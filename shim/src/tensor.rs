//! Typed tensor descriptors and host tensors. Every tensor crossing into IREE
//! is described here first, so a wrong dtype, rank, shape or byte count is an
//! error in Rust, before any native call.

use std::fmt;

use crate::error::{Error, Result};

/// Element types the runtime moves across the host/device boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    I32,
    I8,
    U8,
    /// One byte per element, 0 or 1 (MLIR `i1` as stored by IREE).
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The element type as written in MLIR tensor types.
    pub fn mlir(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "ui8",
            DType::Bool => "i1",
        }
    }

    /// Parses an MLIR element type (`f32`, `bf16`, `i32`, ...).
    pub fn from_mlir(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "i64" | "si64" => DType::I64,
            "i32" | "si32" => DType::I32,
            "i8" | "si8" => DType::I8,
            "ui8" => DType::U8,
            "i1" => DType::Bool,
            _ => return None,
        })
    }

    /// Parses a safetensors header dtype (`F32`, `BF16`, ...).
    pub fn from_safetensors(s: &str) -> Option<DType> {
        Some(match s {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "I8" => DType::I8,
            "U8" => DType::U8,
            "BOOL" => DType::Bool,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir())
    }
}

/// A tensor's type: element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TensorDesc {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorDesc {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorDesc { dtype, shape: shape.into() }
    }

    /// Number of elements, or an error if the shape overflows `usize`.
    pub fn element_count(&self, context: &str) -> Result<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| Error::ShapeOverflow { context: context.to_owned(), shape: self.shape.clone() })
    }

    /// Bytes a dense row-major tensor of this type occupies.
    pub fn byte_len(&self, context: &str) -> Result<usize> {
        self.element_count(context)?
            .checked_mul(self.dtype.size())
            .ok_or_else(|| Error::ShapeOverflow { context: context.to_owned(), shape: self.shape.clone() })
    }

    /// Checks that `self` (what a caller gives) matches `want` (what a
    /// function declares), in the order dtype, rank, shape.
    pub fn check_matches(&self, want: &TensorDesc, context: &str) -> Result<()> {
        if self.dtype != want.dtype {
            return Err(Error::DTypeMismatch { context: context.to_owned(), got: self.dtype, want: want.dtype });
        }
        if self.shape.len() != want.shape.len() {
            return Err(Error::RankMismatch {
                context: context.to_owned(),
                got: self.shape.len(),
                want: want.shape.len(),
            });
        }
        if self.shape != want.shape {
            return Err(Error::ShapeMismatch {
                context: context.to_owned(),
                got: self.shape.clone(),
                want: want.shape.clone(),
            });
        }
        Ok(())
    }

    /// The MLIR spelling, e.g. `tensor<2x3xf32>`.
    pub fn mlir(&self) -> String {
        let mut s = String::from("tensor<");
        for d in &self.shape {
            s.push_str(&d.to_string());
            s.push('x');
        }
        s.push_str(self.dtype.mlir());
        s.push('>');
        s
    }

    /// Parses `tensor<2x3xf32>` (static shapes only).
    pub fn from_mlir(ty: &str) -> Option<TensorDesc> {
        let inner = ty.trim().strip_prefix("tensor<")?.strip_suffix('>')?;
        let mut parts: Vec<&str> = inner.split('x').collect();
        let dtype = DType::from_mlir(parts.pop()?)?;
        let shape = parts.iter().map(|p| p.parse::<usize>().ok()).collect::<Option<Vec<_>>>()?;
        Some(TensorDesc { dtype, shape })
    }
}

impl fmt::Display for TensorDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.mlir())
    }
}

/// Elements that have a [`DType`] and a plain little-endian byte layout.
pub trait Element: Copy + Default + 'static {
    const DTYPE: DType;
    fn to_le(self, out: &mut Vec<u8>);
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn from_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(bytes);
                <$t>::from_le_bytes(a)
            }
        }
    };
}
element!(f32, DType::F32);
element!(i32, DType::I32);
element!(i64, DType::I64);
element!(i8, DType::I8);
element!(u8, DType::U8);

/// A dense row-major tensor in host memory whose bytes match its descriptor.
#[derive(Clone, PartialEq)]
pub struct HostTensor {
    desc: TensorDesc,
    bytes: Vec<u8>,
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostTensor").field("desc", &self.desc).field("bytes", &self.bytes.len()).finish()
    }
}

impl HostTensor {
    /// Wraps `bytes` after checking their length against dtype and shape.
    pub fn from_bytes(dtype: DType, shape: impl Into<Vec<usize>>, bytes: Vec<u8>) -> Result<Self> {
        let desc = TensorDesc::new(dtype, shape);
        let want = desc.byte_len("host tensor")?;
        if bytes.len() != want {
            return Err(Error::ByteCount {
                context: "host tensor".into(),
                dtype,
                shape: desc.shape,
                got: bytes.len(),
                want,
            });
        }
        Ok(HostTensor { desc, bytes })
    }

    /// Builds a tensor from typed elements; the element count must match.
    pub fn from_slice<T: Element>(shape: impl Into<Vec<usize>>, data: &[T]) -> Result<Self> {
        let mut bytes = Vec::with_capacity(std::mem::size_of_val(data));
        for &x in data {
            x.to_le(&mut bytes);
        }
        HostTensor::from_bytes(T::DTYPE, shape, bytes)
    }

    /// A zero-dimensional tensor.
    pub fn scalar<T: Element>(x: T) -> Self {
        let mut bytes = Vec::new();
        x.to_le(&mut bytes);
        HostTensor { desc: TensorDesc::new(T::DTYPE, Vec::new()), bytes }
    }

    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }

    pub fn dtype(&self) -> DType {
        self.desc.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.desc.shape
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The elements, if `T` is this tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.desc.dtype {
            return Err(Error::DTypeMismatch {
                context: "reading a host tensor".into(),
                got: T::DTYPE,
                want: self.desc.dtype,
            });
        }
        Ok(self.bytes.chunks_exact(self.desc.dtype.size()).map(T::from_le).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlir_types_round_trip() {
        for s in ["tensor<2x3xf32>", "tensor<i32>", "tensor<1x8x4xbf16>", "tensor<7xi1>"] {
            let d = TensorDesc::from_mlir(s).expect("parses");
            assert_eq!(d.mlir(), s);
        }
        assert!(TensorDesc::from_mlir("tensor<?x3xf32>").is_none());
        assert!(TensorDesc::from_mlir("tensor<2xcomplex<f32>>").is_none());
    }

    #[test]
    fn byte_count_is_checked() {
        let err = HostTensor::from_bytes(DType::F32, vec![2, 2], vec![0; 15]).unwrap_err();
        assert!(matches!(err, Error::ByteCount { got: 15, want: 16, .. }), "{err}");
        let t = HostTensor::from_slice(vec![3], &[1i32, 2, 3]).expect("valid");
        assert_eq!(t.to_vec::<i32>().expect("i32"), vec![1, 2, 3]);
        assert!(t.to_vec::<f32>().is_err());
    }

    #[test]
    fn overflow_is_an_error_not_a_panic() {
        let d = TensorDesc::new(DType::F32, vec![usize::MAX, 2]);
        assert!(matches!(d.byte_len("x"), Err(Error::ShapeOverflow { .. })));
    }
}
