//! How many threads OpenBLAS (MLX's f32 matmul on Linux) gives each product, chosen per unit of
//! engine work from how many rows its products multiply a weight matrix by.
//!
//! A batched decode step multiplies every weight matrix by one row per sequence. With 4 to 15
//! rows, OpenBLAS's threaded sgemm measured no faster than one thread (SmolLM2 shapes, mlx on a
//! 2-core machine), while its second thread competes for a core with the engine thread, which
//! builds step n+1's graph while MLX computes step n. Leaving that core to the engine took
//! 4-stream f32 decode from ~31 to ~43 tok/s and 8 streams ~17 % faster (BENCHMARKS.md).
//! One row and prefill are up to twice as fast threaded and keep OpenBLAS's default.
//!
//! The count moves results by rounding. Measured with mlx on SmolLM2's shapes: with two threads,
//! each row of a product of up to 8 rows comes out bit for bit as that row alone; with one
//! thread, from 4 rows on it does not (last-bit differences in most elements). So a batched row's
//! logits can differ from its logits alone in the last bits, as a batched prefill's already did
//! (README, on batching).
//!
//! OpenBLAS is found at run time among the loaded libraries, so builds without it (macOS uses
//! Accelerate, or `MLX_BUN_BLAS=reference`) leave everything as it is. Only the engine thread
//! calls [`fit`]; a change first drains the thread's MLX streams, so no product in flight sees the
//! count move under it.
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use super::backend::synchronize;

/// Products with fewer rows, or more, keep OpenBLAS's default thread count.
const FEW_ROWS: std::ops::Range<usize> = 4..16;

struct OpenBlas {
    set: unsafe extern "C" fn(c_int),
    get: unsafe extern "C" fn() -> c_int,
    /// Threads at load (`OPENBLAS_NUM_THREADS`, else one per core).
    default: c_int,
}

fn openblas() -> Option<&'static OpenBlas> {
    static LIB: OnceLock<Option<OpenBlas>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only returns a library already in the process (never loads or
        // initialises one); the symbols have these C signatures in every OpenBLAS release.
        unsafe {
            let lib = libc::dlopen(c"libopenblas.so.0".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if lib.is_null() {
                return None;
            }
            let set = libc::dlsym(lib, c"openblas_set_num_threads".as_ptr());
            let get = libc::dlsym(lib, c"openblas_get_num_threads".as_ptr());
            if set.is_null() || get.is_null() {
                return None;
            }
            let set = std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int)>(set);
            let get = std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> c_int>(get);
            Some(OpenBlas { set, get, default: get() })
        }
    })
    .as_ref()
}

/// Sets OpenBLAS's threads for the work about to be queued, whose products multiply each weight
/// matrix by `rows` rows at a time.
pub fn fit(rows: usize) {
    let Some(blas) = openblas() else {
        return;
    };
    let want = if FEW_ROWS.contains(&rows) { (blas.default - 1).max(1) } else { blas.default };
    // SAFETY: plain calls into OpenBLAS; nothing of this thread is in flight after the sync.
    unsafe {
        if (blas.get)() != want {
            synchronize();
            (blas.set)(want);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::{random, Array};

    fn threads() -> Option<usize> {
        // SAFETY: plain call into OpenBLAS.
        openblas().map(|b| unsafe { (b.get)() } as usize)
    }

    fn product(x: &Array, w: &Array) -> Vec<f32> {
        let y = x.matmul(w).unwrap();
        y.eval().unwrap();
        y.as_slice::<f32>().to_vec()
    }

    /// With OpenBLAS loaded (CI installs it), few-row products leave a core and others get the
    /// default back; the products agree to rounding.
    #[test]
    fn few_row_products_leave_a_core() {
        let default = openblas().expect("OpenBLAS is loaded (scripts/setup.sh installs libopenblas0)").default as usize;
        assert!(default >= 2, "a machine with 2 or more cores");
        let x = random::normal::<f32>(&[8, 576], None, None, None).unwrap();
        let w = random::normal::<f32>(&[576, 1536], None, None, None).unwrap();
        fit(1);
        assert_eq!(threads(), Some(default));
        let threaded = product(&x, &w);
        fit(8);
        assert_eq!(threads(), Some(default - 1));
        for (a, b) in product(&x, &w).iter().zip(&threaded) {
            // Sums of 576 products of standard normals (size ~24): rounding moves them ~1e-5.
            assert!((a - b).abs() <= 1e-4, "{a} vs {b}");
        }
        fit(128);
        assert_eq!(threads(), Some(default));
    }
}
