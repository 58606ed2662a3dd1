//! Token selection as lazy MLX ops, so a step's graph can be built before the previous token is
//! read back. Order as in mlx-bun/mlx-lm: logit bias → repetition → presence → frequency
//! penalties, log-softmax (logprobs are reported from here), then top-p → min-p → top-k, then
//! argmax (temperature 0) or a categorical draw at `1/temperature` with a per-step key.
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::{ops, random, Array, Dtype};

use super::options::SamplingOptions;
use crate::error::Result;
use crate::mlx::kernels;

/// Per-step PRNG key: `seed ⊕ (step+1)·φ` (φ = 0x9e3779b97f4a7c15), as in mlx-bun.
pub fn step_seed(seed: u64, step: u64) -> u64 {
    seed ^ step.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[derive(Clone)]
pub struct Sampler {
    opts: SamplingOptions,
    /// Prompt and generated tokens (int32), kept only when a penalty needs them.
    history: Option<Array>,
    history_len: i32,
    bias: Option<(Array, Array)>,
}

impl Sampler {
    pub fn new(opts: SamplingOptions, prompt: &[u32]) -> Result<Self> {
        let needs_history = penalty_on(opts.repetition_penalty, true)
            || penalty_on(opts.presence_penalty, false)
            || penalty_on(opts.frequency_penalty, false);
        let history = needs_history.then(|| Array::from_slice(&prompt.iter().map(|&t| t as i32).collect::<Vec<_>>(), &[prompt.len() as i32]));
        let bias = (!opts.logit_bias.is_empty()).then(|| {
            let ids: Vec<i32> = opts.logit_bias.keys().map(|&k| k as i32).collect();
            let vals: Vec<f32> = opts.logit_bias.values().copied().collect();
            let n = ids.len() as i32;
            (Array::from_slice(&ids, &[1, n]), Array::from_slice(&vals, &[1, n]))
        });
        Ok(Sampler { opts, history, history_len: prompt.len() as i32, bias })
    }

    /// Records a generated token (a lazy [1] array is fine).
    pub fn push(&mut self, token: &Array) -> Result<()> {
        if let Some(h) = &self.history {
            self.history = Some(ops::concatenate(&[h.clone(), token.as_dtype(Dtype::Int32)?.reshape(&[1])?], 0)?);
            self.history_len += 1;
        }
        Ok(())
    }

    /// Logits [1, V] → (token [1] as uint32, log-probabilities [1, V] after the processors).
    pub fn sample(&self, logits: &Array, step: u64) -> Result<(Array, Array)> {
        let logits = self.process(logits)?;
        let logprobs = log_softmax(&logits)?;
        let o = &self.opts;
        let token = if o.temperature == 0.0 {
            argmax_axis(&logprobs, -1, None)?
        } else {
            let mut lp = logprobs.clone();
            if o.top_p > 0.0 && o.top_p < 1.0 {
                lp = top_p(&lp, o.top_p)?;
            }
            if o.min_p > 0.0 {
                lp = min_p(&lp, o.min_p, o.min_tokens_to_keep)?;
            }
            if o.top_k > 0 {
                lp = top_k(&lp, o.top_k)?;
            }
            let key = random::key(step_seed(o.seed, step))?;
            random::categorical(ops::multiply(&lp, Array::from_f32(1.0 / o.temperature))?, -1, None, &key)?
        };
        Ok((token.as_dtype(Dtype::Uint32)?, logprobs))
    }

    fn process(&self, logits: &Array) -> Result<Array> {
        let o = &self.opts;
        let mut logits = logits.clone();
        if let Some((ids, vals)) = &self.bias {
            let biased = ops::add(&logits.take_along_axis(ids, -1)?, vals)?;
            logits = logits.put_along_axis(ids, &biased, -1)?;
        }
        if penalty_on(o.repetition_penalty, true) {
            let ids = self.recent(o.repetition_context_size)?;
            let sel = logits.take_along_axis(&ids, -1)?;
            let p = Array::from_f32(o.repetition_penalty);
            let sel = ops::select(&sel.lt(Array::from_f32(0.0))?, &ops::multiply(&sel, &p)?, &ops::divide(&sel, &p)?)?;
            logits = logits.put_along_axis(&ids, &sel, -1)?;
        }
        if penalty_on(o.presence_penalty, false) {
            let ids = self.recent(o.presence_context_size)?;
            let sel = ops::subtract(&logits.take_along_axis(&ids, -1)?, Array::from_f32(o.presence_penalty))?;
            logits = logits.put_along_axis(&ids, &sel, -1)?;
        }
        if penalty_on(o.frequency_penalty, false) {
            let ids = self.recent(o.frequency_context_size)?.reshape(&[-1])?;
            let vocab = logits.shape()[1];
            let n = ids.shape()[0];
            let counts = ops::indexing::scatter_add_single(
                ops::zeros::<f32>(&[vocab])?,
                &ids,
                ops::ones::<f32>(&[n, 1])?,
                0,
            )?;
            logits = ops::subtract(&logits, &ops::multiply(&counts, Array::from_f32(o.frequency_penalty))?)?;
        }
        Ok(logits)
    }

    /// The last `context` history tokens as [1, n] indices (0 = all).
    fn recent(&self, context: u32) -> Result<Array> {
        let h = self.history.as_ref().expect("history is kept whenever a penalty is on");
        let start = if context == 0 { 0 } else { (self.history_len - context as i32).max(0) };
        Ok(h.index(start..).reshape(&[1, -1])?)
    }
}

/// logits − logsumexp(logits) over the vocabulary (in f32 where our kernels run, one node with
/// MLX's numbers).
fn log_softmax(logits: &Array) -> Result<Array> {
    if kernels::exp_rows_fit(&[logits]) {
        return Ok(kernels::log_softmax_rows(logits)?);
    }
    Ok(ops::subtract(logits, &logits.logsumexp_axis(-1, true)?)?)
}

fn penalty_on(p: f32, multiplicative: bool) -> bool {
    if multiplicative {
        p != 0.0 && p != 1.0
    } else {
        p != 0.0
    }
}

fn neg_inf() -> Array {
    Array::from_f32(f32::NEG_INFINITY)
}

/// Keeps the most probable tokens whose cumulative mass reaches `p` (mlx-lm's rule: a token
/// stays when the mass of it and everything less likely exceeds 1 − p).
pub fn top_p(logprobs: &Array, p: f32) -> Result<Array> {
    let order = ops::argsort_axis(logprobs, -1)?;
    let sorted = logprobs.take_along_axis(&order, -1)?;
    let cum = ops::cumsum(&ops::exp(&sorted)?, -1, None, None)?;
    let kept = ops::select(&cum.gt(Array::from_f32(1.0 - p))?, &sorted, &neg_inf())?;
    Ok(ops::full_like(logprobs, &neg_inf(), None)?.put_along_axis(&order, &kept, -1)?)
}

/// Drops tokens less likely than `p` × the most likely one, keeping at least `keep` tokens.
pub fn min_p(logprobs: &Array, p: f32, keep: u32) -> Result<Array> {
    let sorted = ops::negative(&ops::sort_axis(&ops::negative(logprobs)?, -1)?)?;
    let top = sorted.index((.., 0..1));
    let kth = sorted.index((.., (keep as i32 - 1)..(keep as i32)));
    let threshold = ops::minimum(&ops::add(&top, Array::from_f32(p.ln()))?, &kth)?;
    Ok(ops::select(&logprobs.ge(&threshold)?, logprobs, &neg_inf())?)
}

/// Keeps the `k` most likely tokens (ties at the k-th value are kept too).
pub fn top_k(logprobs: &Array, k: u32) -> Result<Array> {
    let vocab = logprobs.shape()[1];
    if k as i32 >= vocab {
        return Ok(logprobs.clone());
    }
    let kth = ops::indexing::topk_axis(logprobs, k as i32, -1)?.min_axis(-1, true)?;
    Ok(ops::select(&logprobs.ge(&kth)?, logprobs, &neg_inf())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(probs: &[f32]) -> Array {
        let logs: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        Array::from_slice(&logs, &[1, probs.len() as i32])
    }

    fn kept(a: &Array) -> Vec<bool> {
        a.eval().unwrap();
        a.as_slice::<f32>().iter().map(|v| v.is_finite()).collect()
    }

    /// Values whose bits differ between two f32 arrays (NaNs alike whatever their payload).
    fn differing(a: &Array, b: &Array) -> usize {
        let (a, b) = (a.reshape(&[-1]).unwrap(), b.reshape(&[-1]).unwrap());
        a.eval().unwrap();
        b.eval().unwrap();
        a.as_slice::<f32>().iter().zip(b.as_slice::<f32>()).filter(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan())).count()
    }

    /// Our log-probabilities kernel (where it runs) gives MLX's `logits − logsumexp(logits)` bit
    /// for bit: a vocabulary's worth of logits, differences from the maximum spanning MLX's exp
    /// from −100 to 0 (every 22 794th float), an infinity either way, a NaN, a row of −inf,
    /// short rows (the lanes' tail), and rows read through strides.
    #[test]
    fn log_softmax_kernel_equals_mlx_bit_for_bit() {
        if !kernels::fma_kernels() {
            return; // our kernels with FMA only (kernels::exp_rows_fit; the CPU decides)
        }
        let v = 49152usize;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut noise = move |scale: f32| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        };
        let spread: Vec<f32> = (0..v).map(|_| noise(20.0)).collect();
        let sweep: Vec<f32> = (0..v).map(|i| -f32::from_bits((i as u32) * (100f32.to_bits() / v as u32))).collect();
        let mut infinities = spread.clone();
        infinities[5] = f32::NEG_INFINITY;
        infinities[77] = f32::INFINITY;
        let mut nan = spread.clone();
        nan[4000] = f32::NAN;
        let wide = Array::from_slice(&[spread, sweep, infinities, nan].concat(), &[4, v as i32]);
        let short: Vec<f32> = (0..13).map(|_| noise(5.0)).chain([f32::NEG_INFINITY; 13]).chain((0..13).map(|i| if i % 2 == 0 { 3e38 } else { -3e38 })).collect();
        let short = Array::from_slice(&short, &[3, 1, 13]);
        let columns = wide.index((.., ..49001));
        let transposed = Array::from_slice(&(0..39).map(|_| noise(9.0)).collect::<Vec<_>>(), &[13, 3]).t();
        for (x, what) in [(&wide, "wide"), (&short, "short"), (&columns, "sliced"), (&transposed, "transposed")] {
            assert!(kernels::exp_rows_fit(&[x]));
            let mlx = ops::subtract(x, &x.logsumexp_axis(-1, true).unwrap()).unwrap();
            let ours = kernels::log_softmax_rows(x).unwrap();
            assert_eq!(ours.shape(), mlx.shape());
            assert_eq!(differing(&ours, &mlx), 0, "{what}: values differ");
        }
    }

    #[test]
    fn top_p_keeps_smallest_set_reaching_mass() {
        let x = lp(&[0.5, 0.1, 0.3, 0.1]);
        assert_eq!(kept(&top_p(&x, 0.7).unwrap()), [true, false, true, false]);
        assert_eq!(kept(&top_p(&x, 0.4).unwrap()), [true, false, false, false]);
        assert_eq!(kept(&top_p(&x, 1.0).unwrap()), [true, true, true, true]);
    }

    #[test]
    fn min_p_is_relative_to_the_best_and_keeps_minimum() {
        let x = lp(&[0.5, 0.04, 0.3, 0.16]);
        assert_eq!(kept(&min_p(&x, 0.5, 1).unwrap()), [true, false, true, false]);
        assert_eq!(kept(&min_p(&x, 0.99, 3).unwrap()), [true, false, true, true]);
    }

    #[test]
    fn top_k_keeps_k_best() {
        let x = lp(&[0.1, 0.4, 0.2, 0.3]);
        assert_eq!(kept(&top_k(&x, 2).unwrap()), [false, true, false, true]);
        assert_eq!(kept(&top_k(&x, 10).unwrap()), [true; 4]);
    }

    fn run(opts: SamplingOptions, history: &[u32], logits: &[f32], step: u64) -> (u32, Vec<f32>) {
        let s = Sampler::new(opts, history).unwrap();
        let (t, lp) = s.sample(&Array::from_slice(logits, &[1, logits.len() as i32]), step).unwrap();
        lp.eval().unwrap();
        (t.item_exact::<u32>(), lp.as_slice::<f32>().to_vec())
    }

    #[test]
    fn greedy_penalties_and_bias_follow_mlx_lm_maths() {
        let logits = [2.0, 1.0, -1.0, 0.5];
        assert_eq!(run(SamplingOptions::default(), &[], &logits, 0).0, 0);
        // repetition 2.0 on tokens 0 and 2: 2.0 → 1.0, −1.0 → −2.0; so token 1 ties token 0 ... bias breaks it
        let mut o = SamplingOptions { repetition_penalty: 2.0, ..Default::default() };
        o.logit_bias.insert(1, 0.25);
        let (t, lp) = run(o, &[0, 2, 0], &logits, 0);
        assert_eq!(t, 1);
        let z = [1.0f32, 1.25, -2.0, 0.5];
        let lse = z.iter().map(|v| v.exp()).sum::<f32>().ln();
        for (a, b) in lp.iter().zip(z.iter()) {
            assert!((a - (b - lse)).abs() < 1e-6);
        }
        // frequency counts repeats, presence does not
        let o = SamplingOptions { frequency_penalty: 1.0, ..Default::default() };
        let (_, lp_f) = run(o, &[0, 0, 3], &logits, 0);
        let o = SamplingOptions { presence_penalty: 1.0, ..Default::default() };
        let (_, lp_p) = run(o, &[0, 0, 3], &logits, 0);
        assert!(((lp_f[1] - lp_f[0]) - (1.0 - 0.0)).abs() < 1e-5, "freq: {lp_f:?}");
        assert!(((lp_p[1] - lp_p[0]) - (1.0 - 1.0)).abs() < 1e-5, "presence: {lp_p:?}");
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let logits = [0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let o = SamplingOptions { temperature: 1.0, seed: 42, ..Default::default() };
        let a: Vec<u32> = (0..50).map(|s| run(o.clone(), &[], &logits, s).0).collect();
        let b: Vec<u32> = (0..50).map(|s| run(o.clone(), &[], &logits, s).0).collect();
        assert_eq!(a, b);
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() >= 4, "uniform draws should vary: {a:?}");
        let o = SamplingOptions { temperature: 1.0, top_k: 1, seed: 7, ..Default::default() };
        assert!((0..20).all(|s| run(o.clone(), &[], &[0.0, 3.0, 1.0], s).0 == 1));
    }

    #[test]
    fn step_seed_mixes_step_into_seed() {
        assert_eq!(step_seed(0, 0), 0x9e37_79b9_7f4a_7c15);
        assert_ne!(step_seed(1, 0), step_seed(1, 1));
    }
}
