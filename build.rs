//! Link settings for the addon, the CLI and the tests. mlx-sys's own link arguments do not reach
//! final artifacts, so the rpath to libmlx is set here from its `DEP_MLX_LIBDIR`.
use std::path::Path;

fn main() {
    if std::env::var_os("CARGO_FEATURE_NODE").is_some() {
        napi_build::setup();
    }
    println!("cargo:rerun-if-env-changed=MLX_BUN_BLAS");
    let macos = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos");
    // Shipped layout: the runtime sits next to the .node / binary in `mlx/lib` (wheel layout).
    let origin = if macos { "@loader_path" } else { "$ORIGIN" };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{origin}/mlx/lib");
    // Development: the MLX the build used.
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    // The wheel's libmlx uses a bundled reference BLAS; linking OpenBLAS first puts its sgemm
    // ahead in symbol lookup (measured 10-20x faster matmuls). MLX_BUN_BLAS=reference opts out.
    if !macos && std::env::var("MLX_BUN_BLAS").as_deref() != Ok("reference") {
        let openblas = ["/usr/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0"];
        if openblas.iter().any(|p| Path::new(p).exists()) {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
            println!("cargo:rustc-link-arg=-l:libopenblas.so.0");
            println!("cargo:rustc-link-arg=-Wl,--as-needed");
        } else {
            println!("cargo:warning=libopenblas0 not found: MLX will use the wheel's slow reference BLAS");
        }
    }
}
