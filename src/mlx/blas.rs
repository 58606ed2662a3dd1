//! OpenBLAS's idle spin. After each product OpenBLAS's worker threads spin (`sched_yield`) for
//! about 2^28 cycles before they sleep; our engine runs its own work on MLX's stream threads
//! and its kernels' helper threads beside BLAS (our quantized and f32 kernels), and the spinning
//! workers take their cores (Gemma-3-270M decode with `f32Matmuls: 'all'` on two cores: system CPU
//! time 6-7 s -> 1.3 s for 256 tokens, decode 6-18 % faster; f32 batches through BLAS unchanged).
//! OpenBLAS reads `OPENBLAS_THREAD_TIMEOUT` once, as the program loads it, before `main`: the CLI
//! runs itself again with it set, and the addon's loader (lib/native.js) sets it around loading.
//! A value the user set is kept.

/// 2^4 cycles, OpenBLAS's least: workers sleep as soon as they are idle.
pub const THREAD_TIMEOUT: &str = "4";

/// Runs this program again with `OPENBLAS_THREAD_TIMEOUT` set, when it is unset (Linux, where
/// MLX's CPU backend takes BLAS from OpenBLAS). Returns only when it is set already, or when the
/// program cannot be run again; then it runs on as it is (the spin costs speed, nothing else).
pub fn run_again_without_spin() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("OPENBLAS_THREAD_TIMEOUT").is_some() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else { return };
        let mut args = std::env::args_os();
        let mut command = std::process::Command::new(exe);
        if let Some(name) = args.next() {
            command.arg0(name);
        }
        // `exec` replaces this process and returns only on failure.
        let _failed = command.args(args).env("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT).exec();
    }
}
