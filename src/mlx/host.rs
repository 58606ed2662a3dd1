//! Moving data between host memory and MLX arrays.
use mlx_rs::{Array, Dtype};

use crate::error::{Error, Result};

/// Copies raw little-endian tensor bytes into a new MLX array.
pub fn array_from_bytes(name: &str, bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
    let count: i64 = shape.iter().map(|&d| d as i64).product();
    let expected = count as usize * dtype_size(dtype);
    if bytes.len() != expected {
        return Err(Error::tensor(
            name,
            format!("shape {shape:?} of {dtype:?} needs {expected} bytes, found {}", bytes.len()),
        ));
    }
    // SAFETY: the length was checked above; MLX copies the buffer before returning.
    Ok(unsafe { Array::from_raw_data(bytes.as_ptr().cast(), shape, dtype) })
}

pub fn dtype_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
    }
}

/// Evaluates `a` as f32 and copies it out (a strided view, such as a slice, in row order).
pub fn to_f32_vec(a: &Array) -> Result<Vec<f32>> {
    let a = a.as_dtype(Dtype::Float32)?.contiguous()?;
    a.eval()?;
    Ok(a.as_slice::<f32>().to_vec())
}

/// Evaluates `a` and copies its raw little-endian bytes out, in row order.
pub fn to_bytes(a: &Array) -> Result<Vec<u8>> {
    let a = &a.contiguous()?;
    a.eval()?;
    fn raw<T: mlx_rs::ArrayElement>(a: &Array) -> Vec<u8> {
        let s = a.as_slice::<T>();
        // SAFETY: plain numeric data viewed as bytes.
        unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }.to_vec()
    }
    Ok(match a.dtype() {
        Dtype::Float32 => raw::<f32>(a),
        Dtype::Float16 => raw::<half::f16>(a),
        Dtype::Bfloat16 => raw::<half::bf16>(a),
        Dtype::Uint32 => raw::<u32>(a),
        Dtype::Int32 => raw::<i32>(a),
        Dtype::Uint8 => raw::<u8>(a),
        other => return Err(Error::Mlx(format!("cannot export dtype {other:?}"))),
    })
}
