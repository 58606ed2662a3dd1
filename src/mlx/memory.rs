//! Memory handed back to the system when the engine goes idle, and how much MLX holds.
use mlx_rs::error::Exception;

/// Bytes of the MLX arrays alive now (MLX's allocator counter: no stream, any thread).
pub fn active_bytes() -> usize {
    mlx_rs::memory::active_memory().unwrap_or(0)
}

/// MLX's buffer cache, then, with glibc, the free pages malloc keeps in its arenas. A busy batch
/// frees many large activations; glibc keeps such freed memory for reuse (raising its mmap
/// threshold as they are freed), so without this an idle server or app would stay at the resident
/// size of its busiest moment. Called when the engine has no work, never between steps.
pub fn release_idle() -> Result<(), Exception> {
    mlx_rs::memory::clear_cache()?;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of glibc's own arenas, under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
    Ok(())
}
