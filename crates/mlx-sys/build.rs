//! Builds mlx-c (from the published mlx-sys 0.7.0 archive in cargo's registry cache) against a
//! prebuilt MLX shared library, generates the FFI bindings, and publishes `DEP_MLX_*` metadata.
//!
//! MLX is found, in order, at `$MLX_PREFIX`, at `<workspace>/.mlx/mlx-cpu/mlx` (what
//! `scripts/setup.sh` unpacks from the `mlx-cpu` / `mlx-metal` wheel), or wherever
//! `$PYTHON -c "import mlx"` finds it. A prefix holds `include/mlx/**` and `lib/libmlx.{so,dylib}`.
use std::{
    env,
    ffi::OsStr,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

const UPSTREAM: &str = "mlx-sys-0.7.0";

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let macos = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos");
    for f in ["compat/half_compat.cpp", "compat/mach_time.c", "compat/std_format_shim.h", "kernels/affine_rows.cpp", "kernels/factored_rows.h", "kernels/q8_rows.h", "kernels/half_rows.h", "kernels/row_pool.h", "kernels/f32t_rows.h", "kernels/row_ops.h", "kernels/rope_rows.h", "kernels/rms_rows.h", "kernels/sdpa_rows.h", "kernels/exp_rows.h", "kernels/values.h"] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=CARGO_HOME");

    let mlx_c = unpack_mlx_c(&out);
    let prefix = mlx_prefix(&manifest);
    let libdir = prefix.join("lib");
    let incdir = prefix.join("include");
    let libname = if macos { "libmlx.dylib" } else { "libmlx.so" };
    if !libdir.join(libname).exists() || !incdir.join("mlx/mlx.h").exists() {
        panic!(
            "mlx-sys: {} has no lib/{libname} and include/mlx/mlx.h; point MLX_PREFIX at the `mlx/` \
             folder of the mlx-cpu (Linux) or mlx-metal (macOS) wheel, or run scripts/setup.sh",
            prefix.display()
        );
    }
    check_version(&mlx_c, &prefix);

    let shim = manifest.join("compat/std_format_shim.h");
    let mut sources: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some(OsStr::new("cpp")))
        .collect();
    sources.sort();
    cpp(&mlx_c, &incdir, &shim)
        .files(&sources)
        .cargo_metadata(false)
        .compile("mlxc");

    // Our own CPU kernels, MLX primitives built against the same headers (kernels/*.cpp say why).
    // No contraction into fused multiply-adds: the kernels promise MLX's rounding, operation by
    // operation. No strict aliasing: kernels/sdpa_rows.h calls MLX's `simd::exp` from its headers,
    // which reads an int vector's bytes as floats through a cast pointer.
    cpp(&mlx_c, &incdir, &shim)
        .file(manifest.join("kernels/affine_rows.cpp"))
        .flag("-ffp-contract=off")
        .flag_if_supported("-fno-strict-aliasing")
        .compile("mlx_bun_kernels");

    // mlx-c declares the f16/bf16 accessors only where the C compiler has __fp16 (ARM); mlx-rs
    // calls them on every target.
    let arm = env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("aarch64");
    if !arm {
        cpp(&mlx_c, &incdir, &shim)
            .file(manifest.join("compat/half_compat.cpp"))
            .compile("mlx_half_compat");
    }
    // mlx-rs seeds its RandomState from macOS's mach_approximate_time().
    if !macos {
        cc::Build::new()
            .file(manifest.join("compat/mach_time.c"))
            .compile("mlx_mach_time_compat");
    }

    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", libdir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib={}", if macos { "c++" } else { "stdc++" });

    // Link arguments do not reach dependents: the final artifact adds its own rpath from these.
    println!("cargo::metadata=libdir={}", libdir.display());
    println!("cargo::metadata=prefix={}", prefix.display());
    println!("cargo::metadata=include={}", incdir.display());

    let mut headers: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some(OsStr::new("h")))
        .collect();
    headers.sort();
    let bindings = headers
        .iter()
        .fold(
            bindgen::Builder::default()
                .rust_target("1.73.0".parse().unwrap())
                .clang_arg(format!("-I{}", mlx_c.display()))
                .blocklist_function("malloc")
                .blocklist_function("realloc"),
            |b, h| b.header(h.to_string_lossy()),
        )
        .generate()
        .expect("mlx-sys: bindgen failed (install libclang: apt-get install libclang1-14 libclang-common-14-dev)");
    bindings.write_to_file(out.join("bindings.rs")).unwrap();
    fs::write(out.join("compat.rs"), if arm { "" } else { include_str!("compat/half_compat.rs") })
        .unwrap();
}

/// Unpacks `src/mlx-c` of the published mlx-sys archive into OUT_DIR and returns its root.
fn unpack_mlx_c(out: &Path) -> PathBuf {
    let root = out.join(UPSTREAM).join("src/mlx-c");
    if root.join("mlx/c/mlx.h").exists() {
        return root;
    }
    let archive = find_archive().unwrap_or_else(|| {
        panic!(
            "mlx-sys: {UPSTREAM}.crate is not in cargo's registry cache; run \
             `cargo fetch --manifest-path crates/mlx-sys/upstream/Cargo.toml` (scripts/setup.sh does)"
        )
    });
    let file = fs::File::open(&archive).unwrap();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().into_owned();
        if path.starts_with(format!("{UPSTREAM}/src/mlx-c")) {
            entry.unpack_in(out).unwrap();
        }
    }
    root
}

fn find_archive() -> Option<PathBuf> {
    let home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let cache = home.join("registry/cache");
    fs::read_dir(cache)
        .ok()?
        .filter_map(|d| d.ok())
        .map(|d| d.path().join(format!("{UPSTREAM}.crate")))
        .find(|p| p.exists())
}

fn mlx_prefix(manifest: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=MLX_PREFIX");
    println!("cargo:rerun-if-env-changed=PYTHON");
    if let Some(p) = env::var_os("MLX_PREFIX") {
        return PathBuf::from(p);
    }
    let local = manifest.join("../../.mlx/mlx-cpu/mlx");
    if local.join("include/mlx/mlx.h").exists() {
        return local.canonicalize().unwrap();
    }
    let py = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    match Command::new(&py)
        .args(["-c", "import mlx; print(list(mlx.__path__)[0])"])
        .output()
    {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        _ => panic!(
            "mlx-sys: no MLX found; set MLX_PREFIX to the `mlx/` folder of the mlx-cpu==0.32.2 \
             (Linux) or mlx-metal==0.32.2 (macOS) wheel, or run scripts/setup.sh"
        ),
    }
}

/// mlx-c is written against one MLX release (its CMakeLists' GIT_TAG); other headers do not
/// compile (e.g. 0.32.4 changed gather_qmm), so refuse a mismatch with a clear message.
fn check_version(mlx_c: &Path, prefix: &Path) {
    let header = fs::read_to_string(prefix.join("include/mlx/version.h")).unwrap_or_default();
    let part = |k: &str| {
        header
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define MLX_VERSION_{k} ")))
            .map(|s| s.trim().to_owned())
    };
    let found = match (part("MAJOR"), part("MINOR"), part("PATCH")) {
        (Some(a), Some(b), Some(c)) => format!("{a}.{b}.{c}"),
        _ => return,
    };
    let cmake = fs::read_to_string(mlx_c.join("CMakeLists.txt")).unwrap_or_default();
    let pinned = cmake.lines().find_map(|l| {
        let tag = l.trim().strip_prefix("GIT_TAG v")?;
        tag.split(|c: char| c == ')' || c.is_whitespace()).next().map(str::to_owned)
    });
    println!("cargo::metadata=version={found}");
    if let Some(pinned) = pinned {
        if pinned != found {
            panic!(
                "mlx-sys: MLX at {} is {found} but mlx-c targets MLX {pinned}; use the \
                 mlx-cpu=={pinned} / mlx-metal=={pinned} wheel",
                prefix.display()
            );
        }
    }
}

fn cpp(mlx_c: &Path, incdir: &Path, shim: &Path) -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++20")
        .pic(true)
        .opt_level(2)
        .debug(false)
        .include(mlx_c)
        .include(incdir)
        .flag("-include")
        .flag(shim.to_str().unwrap())
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-variable");
    b
}
