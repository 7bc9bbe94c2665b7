//! The MLX side: operands in, results out as f32, through mlx-rs on the mlx-cpu wheel.
#![forbid(unsafe_code)]

use anyhow::Result;
use mlx_rs::{Array, Dtype};

pub fn array(data: &[f32], shape: &[usize]) -> Array {
    let shape: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    Array::from_slice(data, &shape)
}

/// `data` (values bf16 holds exactly) as a bf16 array: the cast is exact.
pub fn array_bf16(data: &[f32], shape: &[usize]) -> Result<Array> {
    Ok(array(data, shape).as_dtype(Dtype::Bfloat16)?)
}

/// The values of an evaluated array, widened to f32 (exact from bf16), row-major.
pub fn values(a: &Array) -> Result<Vec<f32>> {
    let a = if a.dtype() == Dtype::Float32 { a.clone() } else { a.as_dtype(Dtype::Float32)? };
    // A copy through reshape makes strided results (transposes) contiguous.
    let a = a.reshape(&[-1])?;
    a.eval()?;
    Ok(a.as_slice::<f32>().to_vec())
}

pub fn words(a: &Array) -> Result<Vec<u32>> {
    let a = a.reshape(&[-1])?;
    a.eval()?;
    Ok(a.as_slice::<u32>().to_vec())
}

/// The dtype's name as mlxcel-shim spells it (`f32`, `bf16`).
pub fn dtype_name(a: &Array) -> String {
    match a.dtype() {
        Dtype::Float32 => "f32".to_owned(),
        Dtype::Bfloat16 => "bf16".to_owned(),
        Dtype::Float16 => "f16".to_owned(),
        other => format!("{other:?}"),
    }
}
