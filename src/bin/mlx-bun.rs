//! The `mlx-bun` command (the same CLI `npx mlx-bun` runs through the addon).
fn main() {
    mlx_bun::mlx::blas::run_again_without_spin();
    std::process::exit(mlx_bun::cli::run(std::env::args().skip(1).collect()));
}
