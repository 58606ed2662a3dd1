//! One forward for every kind of step: rows that feed different numbers of tokens in one step get,
//! per row, the logits and caches each gets alone, on caches of their own and stacked: bit for bit
//! where no product goes through BLAS, within BLAS's roundings where one does (`Match`).
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use super::{create_model, gguf_weights, LanguageModel, Logits, StepContext, Tokens};
use crate::cache::{BatchKvCache, CacheView, LayerCache};
use crate::mlx::host::to_f32_vec;

const ALL: StepContext<'static> = StepContext { logits: Logits::All, check: None };
const FILL: StepContext<'static> = StepContext { logits: Logits::None, check: None };

fn load(var: &str) -> Box<dyn LanguageModel> {
    let g = crate::gguf::tests::test_file(var);
    let (w, cfg) = gguf_weights::load(&g).unwrap();
    create_model(w, cfg).unwrap()
}

/// Row histories of different lengths (so that a stack pads them), and the new tokens each row
/// feeds in one step: 1, 3 and 7.
fn rows() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let histories = vec![vec![1, 502, 9, 1234, 77], (10..19).collect(), vec![4000, 12]];
    let news = vec![vec![88], vec![3, 1500, 42], vec![7, 8, 9, 10, 11, 12, 13]];
    (histories, news)
}

fn prefilled(model: &dyn LanguageModel, history: &[u32]) -> Vec<LayerCache> {
    let mut caches = model.new_cache();
    model.forward(&Tokens::one(history), CacheView::Rows(&mut [&mut caches]), &FILL).unwrap();
    caches
}

/// Row `i`'s logits for its last `n` columns of `logits` [B, L, V], as host floats.
fn row_logits(logits: &Array, i: i32, n: i32) -> Vec<f32> {
    let l = logits.shape()[1];
    to_f32_vec(&logits.index((i, l - n.., ..))).unwrap()
}


fn alone(model: &dyn LanguageModel, history: &[u32], new: &[u32]) -> (Vec<f32>, Vec<LayerCache>) {
    let mut caches = prefilled(model, history);
    let logits = model.forward(&Tokens::one(new), CacheView::Rows(&mut [&mut caches]), &ALL).unwrap().unwrap();
    (to_f32_vec(&logits).unwrap(), caches)
}

/// How closely a row in a step must match the row alone.
#[derive(Clone, Copy)]
enum Match {
    /// Bit for bit: every product of the model computes each output alike whatever the number of
    /// rows (our quantized kernel, MLX's quantized and half-precision kernels).
    Exact,
    /// Within this absolute difference: the model has f32 products, which go through BLAS, and
    /// OpenBLAS's kernels for 1 row and for 21 (Haswell's and Zen's among them) may sum a row in
    /// another order (Gemma's logits 1.7e-4 apart with those, equal with the AVX-512 ones; both
    /// checked with `OPENBLAS_CORETYPE`), as in mlx-lm's batches. A misplaced pad, mask or
    /// position moves logits by far more (a RoPE position off by one in the ragged rows moves
    /// them by 35).
    Within(f32),
}

fn assert_same(got: &[f32], want: &[f32], what: &str, m: Match) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    match m {
        Match::Exact => assert!(got == want, "{what}: differs from the row alone (max |diff| {worst})"),
        Match::Within(tol) => assert!(worst <= tol && got.iter().all(|v| v.is_finite()), "{what}: differs from the row alone by {worst} (allowed {tol})"),
    }
}

/// Each layer's keys and values at the positions held (none of these caches has wrapped), as
/// host floats.
fn contents(caches: &[LayerCache]) -> Vec<Vec<f32>> {
    caches
        .iter()
        .flat_map(|c| c.state().into_iter().map(move |a| to_f32_vec(&a.index((.., .., ..c.offset() as i32, ..))).unwrap()))
        .collect()
}

fn check_ragged_step(model: &dyn LanguageModel, stacked: bool, m: Match) {
    let (histories, news) = rows();
    let alone: Vec<(Vec<f32>, Vec<LayerCache>)> = histories.iter().zip(&news).map(|(h, n)| alone(model, h, n)).collect();
    let news_ref: Vec<&[u32]> = news.iter().map(Vec::as_slice).collect();
    let tokens = Tokens::ragged(&news_ref);
    let mut own: Vec<Vec<LayerCache>> = histories.iter().map(|h| prefilled(model, h)).collect();
    let mut stack = BatchKvCache::default();
    let logits = if stacked {
        stack.arrange(own.drain(..).enumerate().map(|(i, c)| (i as u64, Some(c))).collect()).unwrap();
        model.forward(&tokens, CacheView::Stacked(&mut stack), &ALL).unwrap().unwrap()
    } else {
        let mut views: Vec<&mut [LayerCache]> = own.iter_mut().map(Vec::as_mut_slice).collect();
        model.forward(&tokens, CacheView::Rows(&mut views), &ALL).unwrap().unwrap()
    };
    assert_eq!(logits.shape()[..2], [3, 7]);
    let kind = if stacked { "stacked" } else { "own caches" };
    for (i, (want, _)) in alone.iter().enumerate() {
        assert_same(&row_logits(&logits, i as i32, news[i].len() as i32), want, &format!("row {i} ({kind})"), m);
    }
    // The next step feeds one token per row; each row continues as it would alone.
    let next = [5u32, 6, 7];
    let one: Vec<&[u32]> = next.iter().map(std::slice::from_ref).collect();
    let logits = if stacked {
        model.forward(&Tokens::ragged(&one), CacheView::Stacked(&mut stack), &ALL).unwrap().unwrap()
    } else {
        let mut views: Vec<&mut [LayerCache]> = own.iter_mut().map(Vec::as_mut_slice).collect();
        model.forward(&Tokens::ragged(&one), CacheView::Rows(&mut views), &ALL).unwrap().unwrap()
    };
    for (i, (_, caches)) in alone.into_iter().enumerate() {
        let mut caches = caches;
        let want = model.forward(&Tokens::one(&next[i..i + 1]), CacheView::Rows(&mut [&mut caches]), &ALL).unwrap().unwrap();
        assert_same(&row_logits(&logits, i as i32, 1), &to_f32_vec(&want).unwrap(), &format!("row {i}, next step ({kind})"), m);
        let held = if stacked { stack.take(i as u64).unwrap() } else { std::mem::take(&mut own[i]) };
        assert_eq!(held[0].offset(), histories[i].len() + news[i].len() + 1);
        let (got_kv, want_kv) = (contents(&held), contents(&caches));
        assert_eq!(got_kv.len(), want_kv.len(), "row {i}'s cache: arrays ({kind})");
        for (j, (got, want)) in got_kv.iter().zip(want_kv).enumerate() {
            assert_same(got, &want, &format!("row {i}'s cache, array {j} ({kind})"), m);
        }
    }
}

/// Set MLX_BUN_TEST_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (real weights) and run with
/// `--ignored`.
#[test]
#[ignore = "needs MLX_BUN_TEST_GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf"]
fn rows_feeding_1_3_and_7_tokens_get_what_each_gets_alone() {
    let model = load("MLX_BUN_TEST_GGUF");
    assert!(model.stackable());
    check_ragged_step(model.as_ref(), false, Match::Exact);
    check_ragged_step(model.as_ref(), true, Match::Exact);
}

/// The same for Gemma 3, whose sliding-window layers keep rotating caches (rows on caches of
/// their own). Set MLX_BUN_TEST_GEMMA_GGUF to gemma-3-270m-q4_k_m.gguf.
#[test]
#[ignore = "needs MLX_BUN_TEST_GEMMA_GGUF=path/to/gemma-3-270m-q4_k_m.gguf"]
fn gemma_rows_feeding_1_3_and_7_tokens_get_what_each_gets_alone() {
    let model = load("MLX_BUN_TEST_GEMMA_GGUF");
    assert!(!model.stackable());
    check_ragged_step(model.as_ref(), false, Match::Within(1e-3));
}
