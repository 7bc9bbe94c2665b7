//! Owned golden tensors decoded from safetensors (little-endian f32, i64 or u8).

use safetensors::Dtype;

/// Element storage of a golden tensor; the oracle writes only these three dtypes.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

/// One stage's golden values with their shape (row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl Tensor {
    /// Decodes a safetensors view; `None` for a dtype the oracle never writes.
    pub(crate) fn from_view(dtype: Dtype, shape: &[usize], bytes: &[u8]) -> Option<Self> {
        let data = match dtype {
            Dtype::F32 => {
                TensorData::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            Dtype::I64 => TensorData::I64(
                bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            ),
            Dtype::U8 => TensorData::U8(bytes.to_vec()),
            _ => return None,
        };
        Some(Self { shape: shape.to_vec(), data })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::F32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::U8(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype_name(&self) -> &'static str {
        match self.data {
            TensorData::F32(_) => "f32",
            TensorData::I64(_) => "i64",
            TensorData::U8(_) => "u8",
        }
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::I64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_u8(&self) -> Option<&[u8]> {
        match &self.data {
            TensorData::U8(v) => Some(v),
            _ => None,
        }
    }

    /// Integer view of an integer tensor (i64 as is, u8 widened), for exact comparisons.
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        match &self.data {
            TensorData::I64(v) => Some(v.clone()),
            TensorData::U8(v) => Some(v.iter().map(|&x| i64::from(x)).collect()),
            TensorData::F32(_) => None,
        }
    }
}

/// The per-axis coordinate of a row-major flat index (empty shape: the flat index alone).
pub(crate) fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    if shape.is_empty() {
        return vec![flat];
    }
    let mut coord = vec![0; shape.len()];
    for (axis, &dim) in shape.iter().enumerate().rev() {
        let dim = dim.max(1);
        coord[axis] = flat % dim;
        flat /= dim;
    }
    coord
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_little_endian_values() {
        let bytes: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = Tensor::from_view(Dtype::F32, &[2], &bytes).expect("f32 decodes");
        assert_eq!(t.as_f32(), Some(&[1.5, -2.0][..]));
        let bytes: Vec<u8> = [7i64, -1].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = Tensor::from_view(Dtype::I64, &[1, 2], &bytes).expect("i64 decodes");
        assert_eq!(t.to_i64(), Some(vec![7, -1]));
        assert!(Tensor::from_view(Dtype::BF16, &[1], &[0, 0]).is_none());
    }

    #[test]
    fn unravels_row_major() {
        assert_eq!(unravel(0, &[2, 3]), vec![0, 0]);
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(unravel(7, &[2, 2, 2]), vec![1, 1, 1]);
        assert_eq!(unravel(4, &[]), vec![4]);
    }
}
