//! Tests of layers.rs (kept apart to keep that file readable).
use super::*;
use mlx_rs::random;

fn host(a: Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// Our RMSNorm kernel and the kept compiled RMSNorm give MLX's `fast::rms_norm` bit for bit, in
/// f32, bf16 and f16, for widths whose 1/n is no short decimal (MLX's compiler would print it
/// rounded).
#[test]
fn compiled_rms_norm_equals_mlx_bit_for_bit() {
    assert!(backend::is_cpu(), "the compiled RMSNorm is the CPU backend's");
    for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
        for (shape, eps) in [(&[1, 1, 576][..], 1e-5), (&[64, 1, 576], 1e-5), (&[4, 8, 1, 960], 1e-6), (&[2, 3, 1, 64], 1e-6), (&[7, 1, 2560], 1e-5)] {
            let n = *shape.last().unwrap();
            let x = random::normal::<f32>(shape, None, None, None).unwrap().as_dtype(dtype).unwrap();
            let w = random::normal::<f32>(&[n], None, None, None).unwrap().as_dtype(dtype).unwrap();
            let norm = RmsNorm::from_weight(w.clone(), eps);
            assert!(compiled::compiles(&x));
            let mlx = fast::rms_norm(&x, Some(&w), eps).unwrap();
            let mlx = host(mlx);
            // Our kernel where it runs, and MLX's compiler (elsewhere).
            let compiled = norm.compiled(&x, (1.0 / n as f64) as f32).unwrap();
            for (ours, how) in [(norm.forward(&x).unwrap(), "forward"), (compiled, "compiled")] {
                let ours = host(ours);
                let differ = ours.iter().zip(&mlx).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "{dtype:?} {shape:?} {how}: {differ} of {} values differ", mlx.len());
            }
        }
    }
}

/// Our SwiGLU kernel (where it runs) gives mlx-lm's compiled `swiglu` bit for bit: gates over
/// every 4 088th f32 bit pattern (NaNs and infinities among them, the sigmoid's exp over its whole
/// range), short rows (the lanes' tail), the halves of a fused gate-and-up product (rows read
/// through strides) and a transposed view.
#[test]
fn swiglu_kernel_equals_compiled_swiglu_bit_for_bit() {
    if !kernels::fma_kernels() {
        return; // our kernels with FMA only (kernels::exp_rows_fit; the CPU decides)
    }
    let differing = |a: &Array, b: &Array| {
        let (a, b) = (host(a.reshape(&[-1]).unwrap()), host(b.reshape(&[-1]).unwrap()));
        a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan())).count()
    };
    let (rows, n) = (684, 1536);
    let count = rows * n;
    let gates: Vec<f32> = (0..count).map(|i| f32::from_bits(i as u32 * (u32::MAX / count as u32))).collect();
    let gate = Array::from_slice(&gates, &[rows as i32, 1, n as i32]);
    let x = random::normal::<f32>(&[rows as i32, 1, n as i32], None, None, None).unwrap();
    let short = random::normal::<f32>(&[3, 1, 13], None, None, None).unwrap();
    let fused = ops::multiply(&random::normal::<f32>(&[5, 2006], None, None, None).unwrap(), Array::from_f32(8.0)).unwrap();
    let (g, u) = (fused.index((.., ..1003)), fused.index((.., 1003..)));
    let transposed = random::normal::<f32>(&[13, 4], None, None, None).unwrap().t();
    for (g, u, what) in [(&gate, &x, "sweep"), (&short, &short, "short"), (&g, &u, "halves"), (&transposed, &transposed, "transposed")] {
        assert!(kernels::exp_rows_fit(&[g, u]));
        let ours = kernels::swiglu_rows(g, u).unwrap();
        let compiled = compiled_swiglu(g, u).unwrap();
        assert_eq!(ours.shape(), compiled.shape());
        assert_eq!(differing(&ours, &compiled), 0, "{what}: values differ");
    }
}

/// Split products are bit for bit the one product, bf16 and 4-bit alike (on Metal both
/// sides are one product).
#[test]
fn products_by_halves_equal_one_product() {
    #[cfg(target_os = "linux")]
    assert!(backend::is_cpu(), "Linux builds use MLX's CPU backend, where products split");
    let w = random::normal::<f32>(&[1536, 576], None, None, None).unwrap();
    let x = random::normal::<f32>(&[8, 576], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    let bf16 = w.as_dtype(Dtype::Bfloat16).unwrap();
    let h = split_at(1536, 576).expect("1536×576 splits");
    let split = Dense::Native { w: bf16.clone(), halves: Some(halves(&bf16, h).unwrap()) };
    let bias = random::normal::<f32>(&[1536], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    for b in [None, Some(&bias)] {
        let one = ops::matmul(&x, bf16.t()).unwrap();
        let one = b.map_or(one.clone(), |b| ops::addmm(b, &x, bf16.t(), None, None).unwrap());
        assert_eq!(host(split.matmul_t(&x, b, true).unwrap()), host(one));
    }
    let (q, s, b) = ops::quantize(&bf16, 64, 4).unwrap();
    let params = QuantParams { group_size: 64, bits: 4 };
    let kernels = if kernels::affine_rows_fast() { vec![false, true] } else { vec![false] };
    for rows_kernel in kernels {
        let [w0, w1] = halves(&q, h).unwrap();
        let [s0, s1] = halves(&s, h).unwrap();
        let [b0, b1] = halves(&b, h).unwrap();
        let halves = Some([[w0, s0, b0], [w1, s1, b1]]);
        let split = QuantWeight { weight: q.clone(), scales: s.clone(), biases: b.clone(), params, half: None, dequantize_rows: false, rows_kernel, form: AffineForm::Mlx, halves };
        let one = ops::quantized_matmul(&x, &q, &s, &b, true, 64, 4).unwrap();
        assert_eq!(host(split.matmul_t(&x, true).unwrap()), host(one), "our kernel: {rows_kernel}");
    }
}

/// Scales held in f32 (`f32Matmuls: 'all'`) keep the activations' dtype and come closer to
/// the exact product than MLX's bf16 kernel does.
#[test]
fn quantized_products_with_f32_scales_keep_the_dtype_and_come_closer() {
    let f32 = Dtype::Float32;
    let w = random::normal::<f32>(&[1536, 576], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    let x = random::normal::<f32>(&[4, 576], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    let (q, s, b) = ops::quantize(&w, 64, 4).unwrap();
    let params = QuantParams { group_size: 64, bits: 4 };
    let stored = QuantWeight { weight: q.clone(), scales: s.clone(), biases: b.clone(), params, half: None, dequantize_rows: false, rows_kernel: false, form: AffineForm::Mlx, halves: None };
    let (s32, b32) = (s.as_dtype(f32).unwrap(), b.as_dtype(f32).unwrap());
    let held = QuantWeight { weight: q.clone(), scales: s32.clone(), biases: b32.clone(), params, half: Some(Dtype::Bfloat16), dequantize_rows: false, rows_kernel: false, form: AffineForm::Mlx, halves: None };
    let exact = host(ops::matmul(&x.as_dtype(f32).unwrap(), ops::dequantize(&q, &s32, &b32, 64, 4).unwrap().t()).unwrap());
    let err = |y: Array| host(y).iter().zip(&exact).map(|(a, e)| (a - e).abs()).fold(0.0f32, f32::max);
    let fast = held.matmul_t(&x, true).unwrap();
    assert_eq!(fast.dtype(), Dtype::Bfloat16);
    let (fast, slow) = (err(fast), err(stored.matmul_t(&x, true).unwrap()));
    assert!(fast < slow, "f32 scales {fast}, bf16 kernel {slow}");
}

/// `f32Matmuls: 'all'` on the CPU. Where MLX's kernel runs, a product of `DEQUANTIZE_MIN_ROWS`
/// rows or more dequantizes and multiplies in f32 (BLAS), within f32 rounding of the quantized
/// kernel's f32 product; fewer rows keep the quantized kernel bit for bit. Where ours runs,
/// nothing dequantizes: fewer than `FACTORED_MAX_ROWS` rows take the factored form, more MLX's
/// order (the as-stored numbers, bit for bit), and a bf16 model's outputs stay bf16.
#[test]
fn many_rows_under_f32_matmuls_all() {
    let w = random::normal::<f32>(&[1536, 576], None, None, None).unwrap();
    let (q, s, b) = ops::quantize(&w, 32, 4).unwrap();
    let params = QuantParams { group_size: 32, bits: 4 };
    let weight = |half, dequantize_rows, rows_kernel, form| QuantWeight { weight: q.clone(), scales: s.clone(), biases: b.clone(), params, half, dequantize_rows, rows_kernel, form, halves: None };
    let x_of = |n: i32| random::normal::<f32>(&[1, n, 576], None, None, None).unwrap();
    let (quantized, opt_in) = (weight(None, false, false, AffineForm::Mlx), weight(None, true, false, AffineForm::Mlx));
    for n in [1, 3] {
        let x = x_of(n);
        assert_eq!(host(opt_in.matmul_t(&x, true).unwrap()), host(quantized.matmul_t(&x, true).unwrap()), "{n} rows");
    }
    for n in [4, 128] {
        let x = x_of(n);
        let (a, e) = (host(opt_in.matmul_t(&x, true).unwrap()), host(quantized.matmul_t(&x, true).unwrap()));
        let diff = a.iter().zip(&e).map(|(a, e)| (a - e).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-3, "{n} rows: {diff}");
        // Another kernel ran: 1536 sums of 576 products each, in another order.
        assert!(a != e, "{n} rows: the quantized kernel's own result");
    }
    if !(kernels::affine_rows_fast() && kernels::fma_kernels()) {
        return;
    }
    let ours = weight(None, false, true, AffineForm::Mlx);
    for taken in [AffineForm::Factored, AffineForm::Int8] {
        for n in [1, 31, 32, 128] {
            let x = x_of(n);
            let (a, e) = (host(weight(None, false, true, taken).matmul_t(&x, true).unwrap()), host(ours.matmul_t(&x, true).unwrap()));
            let form = host(kernels::affine_rows_matmul(&x, &q, &s, &b, 32, 4, taken).unwrap());
            if i64::from(n) < FACTORED_MAX_ROWS || taken == AffineForm::Int8 {
                assert!(a == form && a != e, "{n} rows: the {taken:?} form");
            } else {
                assert!(a == e && a != form, "{n} rows: MLX's order, not {taken:?}");
            }
        }
    }
    let (s16, b16) = (s.as_dtype(Dtype::Bfloat16).unwrap(), b.as_dtype(Dtype::Bfloat16).unwrap());
    let bf16 = QuantWeight { scales: s16, biases: b16, ..weight(Some(Dtype::Bfloat16), false, true, AffineForm::Factored) };
    for n in [1, 32] {
        assert_eq!(bf16.matmul_t(&x_of(n).as_dtype(Dtype::Bfloat16).unwrap(), true).unwrap().dtype(), Dtype::Bfloat16, "{n} rows");
    }
}

/// Our CPU kernel for quantized products computes what MLX's computes, bit for bit, for
/// every bit width, scale type and activation type it takes (f32, bf16 and f16 products, and
/// mixed ones that promote to f32), for one row of x and for several (W's rows then dequantized
/// once for all of them, in blocks of four rows and one), for row counts of W not a multiple of
/// its sixteen lanes and rows whose words are not a multiple of its eight-word loads, for a
/// strided x, and for x with NaN, infinities and values whose products overflow (NaN written as
/// MLX writes it).
#[test]
fn affine_rows_kernel_equals_mlx_bit_for_bit() {
    #[cfg(all(target_arch = "x86_64", not(target_os = "macos")))]
    assert!(
        kernels::affine_rows_fast() || !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")),
        "an AVX2 + F16C CPU runs the vectorised kernel"
    );
    if !kernels::affine_rows_fast() {
        // Elsewhere MLX's kernel runs, and ours refuses to build a product.
        let (q, s, b) = ops::quantize(&random::normal::<f32>(&[16, 64], None, None, None).unwrap(), 32, 4).unwrap();
        let x = random::normal::<f32>(&[1, 64], None, None, None).unwrap();
        assert!(kernels::affine_rows_matmul(&x, &q, &s, &b, 32, 4, AffineForm::Mlx).is_err());
        return;
    }
    let (f32, f16, bf16) = (Dtype::Float32, Dtype::Float16, Dtype::Bfloat16);
    let bits_of = |a: Array| -> Vec<u32> { host(a).iter().map(|v| v.to_bits()).collect() };
    for (bits, group, rows, cols) in [(4, 32, 1536, 576), (4, 64, 37, 320), (8, 32, 50, 96), (2, 32, 19, 160), (4, 128, 16, 256)] {
        let w = random::normal::<f32>(&[rows, cols], None, None, None).unwrap();
        for scale_type in [f32, f16, bf16] {
            let (q, s, b) = ops::quantize(&w.as_dtype(scale_type).unwrap(), group, bits).unwrap();
            let check = |x: Array| {
                let ours = kernels::affine_rows_matmul(&x, &q, &s, &b, group, bits, AffineForm::Mlx).unwrap();
                let mlx = ops::quantized_matmul(&x, &q, &s, &b, true, group, bits).unwrap();
                assert_eq!((ours.dtype(), ours.shape()), (mlx.dtype(), mlx.shape()));
                let what = format!("{bits} bits, groups of {group}, {rows}x{cols}, {scale_type:?} scales, x {:?} {:?}", x.dtype(), x.shape());
                assert!(bits_of(ours) == bits_of(mlx), "{what}");
            };
            for (shape, x_type, transposed) in [(vec![1, 1, cols], f32, false), (vec![2, 3, cols], f32, false), (vec![cols, 5], f32, true), (vec![1, 2, cols], f16, false), (vec![1, 3, cols], bf16, false), (vec![cols, 17], bf16, true)] {
                let x = random::normal::<f32>(&shape, None, None, None).unwrap();
                let x = if transposed { x.t() } else { x };
                check(x.as_dtype(x_type).unwrap());
            }
            // One row with a NaN, one with infinities of both signs, one of values near the
            // largest f32 (their products overflow; inf - inf makes NaN mid-sum).
            let k = cols as usize;
            let mut v: Vec<f32> = (0..3 * k).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect();
            v[7] = f32::NAN;
            v[k + 3] = f32::INFINITY;
            v[k + 40] = f32::NEG_INFINITY;
            v[2 * k..].iter_mut().enumerate().for_each(|(i, a)| *a = if i % 2 == 0 { 3.0e38 } else { -3.0e38 });
            for x_type in [f32, f16, bf16] {
                check(Array::from_slice(&v, &[3, cols]).as_dtype(x_type).unwrap());
            }
        }
    }
}

/// `form`'s product of x [m, K] with the quantized matrix (q, s, b), checked for what every form
/// of our kernel promises: a row of x gives alone the numbers it gives among the others (batched
/// decode steps equal single ones), and scales held in f16 or bf16 (`f32Matmuls: 'all'` keeps them
/// compact) give the numbers of their values in f32.
fn form_product(x: &Array, q: &Array, s: &Array, b: &Array, group: i32, bits: i32, form: AffineForm) -> Vec<f32> {
    let product = |x: &Array, s: &Array, b: &Array| host(kernels::affine_rows_matmul(x, q, s, b, group, bits, form).unwrap());
    let all = product(x, s, b);
    let (m, rows) = (x.shape()[0], q.shape()[0] as usize);
    for i in 0..m {
        assert_eq!(product(&x.index((i..i + 1, ..)), s, b), all[i as usize * rows..][..rows], "{form:?}, {bits} bits g{group}: row {i} of {m}");
    }
    for dtype in [Dtype::Float16, Dtype::Bfloat16] {
        let (s_half, b_half) = (s.as_dtype(dtype).unwrap(), b.as_dtype(dtype).unwrap());
        let (s32, b32) = (s_half.as_dtype(Dtype::Float32).unwrap(), b_half.as_dtype(Dtype::Float32).unwrap());
        assert_eq!(product(x, &s_half, &b_half), product(x, &s32, &b32), "{form:?}, {bits} bits g{group}, {dtype:?} scales");
    }
    all
}

/// The factored form of our kernel (`f32Matmuls: 'all'`) is a rounding change only: against the
/// exact (f64) product of the dequantized weights its outputs are, over every case, no farther
/// than MLX's order (it rounds less often), each within f32 rounding of the sum's size, and they
/// do differ from MLX's (the form is really taken); a row of x gives the same numbers alone as
/// beside others, and scales held in f16 or bf16 give the numbers of their values in f32. 2/4/8
/// bits, groups of 32 to 128.
#[test]
fn factored_kernel_is_within_f32_rounding_of_the_exact_product() {
    if !kernels::affine_rows_fast() {
        return; // affine_rows_kernel_equals_mlx_bit_for_bit checks which machines run it
    }
    let (mut ours_err, mut mlx_err, mut differ) = (0.0f64, 0.0f64, 0usize);
    for (bits, group, rows, cols) in [(4, 32, 37, 576), (8, 32, 50, 96), (2, 32, 19, 160), (4, 128, 16, 256), (8, 64, 300, 640)] {
        let w = random::normal::<f32>(&[rows, cols], None, None, None).unwrap();
        let (q, s, b) = ops::quantize(&w, group, bits).unwrap();
        let deq = host(ops::dequantize(&q, &s, &b, group, bits).unwrap());
        for m in [1, 3] {
            let x = random::normal::<f32>(&[m, cols], None, None, None).unwrap();
            let ours = form_product(&x, &q, &s, &b, group, bits, AffineForm::Factored);
            let mlx = host(ops::quantized_matmul(&x, &q, &s, &b, true, group, bits).unwrap());
            let xs = host(x);
            let (cols, rows) = (cols as usize, rows as usize);
            for (i, j) in (0..m as usize).flat_map(|i| (0..rows).map(move |j| (i, j))) {
                let terms = (0..cols).map(|k| xs[i * cols + k] as f64 * deq[j * cols + k] as f64);
                let (exact, size) = terms.fold((0.0, 0.0), |(e, a), t| (e + t, a + t.abs()));
                let (o, r) = (ours[i * rows + j] as f64, mlx[i * rows + j] as f64);
                assert!((o - exact).abs() <= 2e-5 * size, "{bits} bits g{group} {rows}x{cols}: {o} against {exact} (size {size})");
                ours_err += (o - exact).abs();
                mlx_err += (r - exact).abs();
                differ += (o != r) as usize;
            }
        }
    }
    assert!(ours_err <= mlx_err, "factored {ours_err}, MLX's order {mlx_err}");
    assert!(differ > 0, "the factored form gave MLX's numbers everywhere");
}

/// x rounded as the int8 form rounds it (llama.cpp's Q8_0): per 32 values, d = max|x| / 127 and
/// each value round-to-even(x · 127 / max|x|), so x̂ = d · q.
fn q8_rounded(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|block| {
            let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let (d, inv) = (amax / 127.0, if amax > 0.0 { 127.0 / amax } else { 0.0 });
            block.iter().map(move |v| d as f64 * (v * inv).round_ties_even() as f64)
        })
        .collect()
}

/// The int8 form of our kernel (`f32Matmuls: 'int8'`) is the product of the stored weights with
/// x rounded to 8 bits per 32 values (`q8_rounded`): against that exact (f64) product each output
/// is within f32 rounding of the sum's size, and against the exact product with x itself within
/// the rounding's half step per value; a row of x gives the same numbers alone as beside others,
/// scales held in f16 or bf16 the numbers of their values in f32, and the form is really taken
/// (its numbers differ from the factored form's). 4 and 8 bits, groups of 32 to 128, rows of an
/// odd number of 32-value blocks and of a number not a multiple of 8 (the kernel pairs blocks, and
/// takes 8 at a time), an x row with a block of zeros and one with a value far larger than the
/// rest.
#[test]
fn int8_kernel_is_the_product_with_x_rounded_to_8_bits() {
    if !(kernels::affine_rows_fast() && kernels::fma_kernels()) {
        return; // affine_rows_kernel_equals_mlx_bit_for_bit checks which machines run it
    }
    let mut differ = 0usize;
    for (bits, group, rows, cols) in [(4, 32, 37, 576), (8, 32, 50, 288), (4, 32, 7, 352), (4, 128, 16, 256), (8, 64, 300, 640), (4, 64, 9, 1536), (8, 128, 5, 384)] {
        let w = random::normal::<f32>(&[rows, cols], None, None, None).unwrap();
        let (q, s, b) = ops::quantize(&w, group, bits).unwrap();
        let deq = host(ops::dequantize(&q, &s, &b, group, bits).unwrap());
        let mut xs = host(random::normal::<f32>(&[3, cols], None, None, None).unwrap());
        xs[..32].fill(0.0);
        xs[2 * cols as usize + 5] = 300.0;
        let x = Array::from_slice(&xs, &[3, cols]);
        let ours = form_product(&x, &q, &s, &b, group, bits, AffineForm::Int8);
        let factored = host(kernels::affine_rows_matmul(&x, &q, &s, &b, group, bits, AffineForm::Factored).unwrap());
        let (cols, rows) = (cols as usize, rows as usize);
        let rounded = q8_rounded(&xs);
        for (i, j) in (0..3).flat_map(|i| (0..rows).map(move |j| (i, j))) {
            let wj = &deq[j * cols..][..cols];
            let (xi, ri) = (&xs[i * cols..][..cols], &rounded[i * cols..][..cols]);
            let with_rounded: f64 = (0..cols).map(|k| ri[k] * wj[k] as f64).sum();
            let size: f64 = (0..cols).map(|k| (ri[k] * wj[k] as f64).abs()).sum();
            let exact: f64 = (0..cols).map(|k| xi[k] as f64 * wj[k] as f64).sum();
            // Half a step of x's rounding per value, the step its block's max / 127.
            let step: f64 = xi.chunks(32).zip(wj.chunks(32)).map(|(xb, wb)| xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64 / 127.0 / 2.0 * wb.iter().map(|w| w.abs() as f64).sum::<f64>()).sum();
            let o = ours[i * rows + j] as f64;
            let what = format!("{bits} bits g{group} {rows}x{cols}, row {i} col {j}");
            assert!((o - with_rounded).abs() <= 2e-5 * size, "{what}: {o} against {with_rounded} (size {size})");
            assert!((o - exact).abs() <= step * 1.0001 + 2e-5 * size, "{what}: {o} against the exact {exact} (steps {step})");
            differ += (o != factored[i * rows + j] as f64) as usize;
        }
    }
    assert!(differ > 0, "the int8 form gave the factored form's numbers everywhere");
    // Where the form does not fit (2 bits, rows shorter than 256 values), the factored one runs.
    for (bits, cols) in [(2, 576), (4, 224), (8, 96)] {
        assert!(!kernels::int8_fits(bits, 32, cols) && kernels::int8_fits(4, 32, 256), "{bits} bits, rows of {cols}");
        let (q, s, b) = ops::quantize(&random::normal::<f32>(&[24, cols], None, None, None).unwrap(), 32, bits).unwrap();
        let x = random::normal::<f32>(&[2, cols], None, None, None).unwrap();
        let form = |f| host(kernels::affine_rows_matmul(&x, &q, &s, &b, 32, bits, f).unwrap());
        assert_eq!(form(AffineForm::Int8), form(AffineForm::Factored), "{bits} bits, rows of {cols}");
    }
}

/// Our half-precision kernel gives MLX's CPU `matmul` and `addmm` bit for bit, bf16 and f16:
/// rows not a multiple of 16, odd and short lengths (the scalar rows, the gathered tail words),
/// several and 3-D rows of x, a bias, and values that overflow, are infinite or NaN.
#[test]
fn half_rows_kernel_equals_mlx_bit_for_bit() {
    if !kernels::affine_rows_fast() {
        return; // the quantized kernel's bit-for-bit test says which machines run our kernels
    }
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan())).count();
    for dtype in [Dtype::Bfloat16, Dtype::Float16] {
        for (x_shape, n, k) in [(&[1, 576][..], 1536, 576), (&[4, 960][..], 2048, 960), (&[3, 100][..], 37, 100), (&[2, 3, 130][..], 50, 130), (&[1, 77][..], 40, 77), (&[5, 18][..], 16, 18)] {
            let scale = if dtype == Dtype::Float16 { 40.0 } else { 1.0 };
            let x = ops::multiply(random::normal::<f32>(x_shape, None, None, None).unwrap(), Array::from_f32(scale)).unwrap();
            // In the last row of x, if it has several: a large value (its sums overflow in f16),
            // ∞ and NaN.
            let rows: i32 = x_shape[..x_shape.len() - 1].iter().product();
            let x = if rows > 1 {
                let specials = Array::from_slice(&[65000.0f32, f32::INFINITY, f32::NAN], &[3]);
                ops::concatenate(&[x.flatten(None, None).unwrap().index(3..), specials], 0).unwrap().reshape(x_shape).unwrap()
            } else {
                x
            };
            let x = x.as_dtype(dtype).unwrap();
            let w = random::normal::<f32>(&[n, k], None, None, None).unwrap().as_dtype(dtype).unwrap();
            let b = random::normal::<f32>(&[n], None, None, None).unwrap().as_dtype(dtype).unwrap();
            assert!(kernels::half_rows_fits(&x, &w, Some(&b)));
            let (ours, mlx) = (host(kernels::half_rows_matmul(&x, &w, None).unwrap()), host(ops::matmul(&x, w.t()).unwrap()));
            assert_eq!(same(&ours, &mlx), 0, "{dtype:?} {x_shape:?}·[{n}, {k}]ᵀ: {} of {} differ", same(&ours, &mlx), mlx.len());
            let (ours, mlx) = (host(kernels::half_rows_matmul(&x, &w, Some(&b)).unwrap()), host(ops::addmm(&b, &x, w.t(), None, None).unwrap()));
            assert_eq!(same(&ours, &mlx), 0, "{dtype:?} {x_shape:?} with a bias: {} of {} differ", same(&ours, &mlx), mlx.len());
            assert_eq!(mlx.iter().any(|v| v.is_nan()), rows > 1, "NaN reaches the outputs of its row only");
            assert!(mlx.iter().any(|v| v.is_finite()));
        }
    }
}

/// Our f32 kernel for a matrix held transposed (`f32Matmuls: 'all'`, few rows) is within f32
/// rounding of the exact product, with and without a bias, for widths that are no multiple of
/// the vector (the scalar columns) and column blocks of several threads; each row of x gives the
/// numbers it gives alone.
#[test]
fn f32t_kernel_is_within_f32_rounding_of_the_exact_product() {
    if !kernels::fma_kernels() {
        return; // the quantized kernel's bit-for-bit test says which machines run our kernels
    }
    for (m, k, n) in [(1, 640, 2048), (3, 576, 1537), (7, 96, 13), (2, 5, 300)] {
        let x = random::normal::<f32>(&[m, k], None, None, None).unwrap();
        let wt = random::normal::<f32>(&[k, n], None, None, None).unwrap();
        let b = random::normal::<f32>(&[n], None, None, None).unwrap();
        let (xs, ws, bs) = (host(x.clone()), host(wt.clone()), host(b.clone()));
        for bias in [None, Some(&b)] {
            let ours = host(kernels::f32t_rows_matmul(&x, &wt, bias).unwrap());
            for i in 0..m {
                let alone = host(kernels::f32t_rows_matmul(&x.index((i..i + 1, ..)), &wt, bias).unwrap());
                assert_eq!(alone, ours[(i * n) as usize..][..n as usize], "[{m}, {k}]·[{k}, {n}]: row {i}");
            }
            let (m, k, n) = (m as usize, k as usize, n as usize);
            for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
                let terms = (0..k).map(|c| xs[i * k + c] as f64 * ws[c * n + j] as f64).chain(bias.map(|_| bs[j] as f64));
                let (exact, size) = terms.fold((0.0, 0.0), |(e, a), t| (e + t, a + t.abs()));
                let o = ours[i * n + j] as f64;
                assert!((o - exact).abs() <= 2e-5 * size, "[{m}, {k}]·[{k}, {n}] ({i}, {j}): {o} against {exact} (size {size})");
            }
        }
    }
}

