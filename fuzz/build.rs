//! The fuzz binaries link libmlx (through mlx-bun); find it at run time where the build found it.
fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
