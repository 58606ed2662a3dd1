//! MLX operations that mlx-rs reaches only through more graph nodes than they need.
use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

/// `dst` with `update` written over its box [start, stop) (step 1 on every axis): one SliceUpdate
/// node. mlx-rs' `index_mut` adds two reshapes of the update around it (leading ones dropped,
/// then put back), and on MLX's CPU backend every node of a decode step costs microseconds.
/// Built on this thread's current stream.
pub fn slice_update(dst: &Array, update: &Array, start: &[i32], stop: &[i32]) -> Result<Array, Exception> {
    let strides = vec![1; start.len()];
    let stream = Stream::thread_local_or_default();
    // SAFETY: every handle is a live mlx-rs array or stream and the three index slices outlive
    // the call; `res` is a fresh handle that we own from here on (freed on failure, wrapped on
    // success). MLX checks the box against the shapes and fails (status non-zero) if it does not
    // fit.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_slice_update(&mut res, dst.as_ptr(), update.as_ptr(), start.as_ptr(), start.len(), stop.as_ptr(), stop.len(), strides.as_ptr(), strides.len(), stream.as_ptr());
        if status != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(Exception::custom(format!("slice_update of {:?} into {:?} at {start:?}..{stop:?} failed", update.shape(), dst.shape())));
        }
        Ok(Array::from_ptr(res))
    }
}
