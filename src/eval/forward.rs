//! The forwards of an evaluation, on the serving path: each window of tokens goes through the
//! engine's own model and KV caches a chunk of positions at a time, so that only one chunk's
//! full-vocabulary logits ever exist, and every logsumexp is taken in f32 whatever the model
//! computes in. Call on the engine thread.
use mlx_rs::ops::indexing::{argmax_axis, IndexOp};
use mlx_rs::transforms::eval;
use mlx_rs::{ops, Array, Dtype};

use super::dump::{Dump, DumpWriter};
use super::metrics::{position_kl, KlSummary};
use crate::cache::{CacheView, KvPolicy, KvQuantOptions};
use crate::error::{Error, Result};
use crate::mlx::host::to_f32_vec;
use crate::model::{LanguageModel, Logits, StepContext, Tokens};

const ALL: StepContext<'static> = StepContext { logits: Logits::All, check: None };

/// How each window is fed: `chunk` positions a forward, into caches quantized as `kv` says.
pub struct Pass {
    pub chunk: usize,
    pub kv: Option<KvPolicy>,
}

impl Pass {
    pub fn new(model: &dyn LanguageModel, chunk: usize, kv: &KvQuantOptions) -> Result<Pass> {
        Ok(Pass { chunk, kv: kv.policy(model.new_cache().len(), model.config().head_dim)? })
    }
}

/// Feeds `window` but its last token (only ever a target) to `model` from a fresh cache, a
/// chunk a forward. `each(start, logits)` gets each forward's logits as f32 [n, V]: the
/// distributions over tokens start+1 ..= start+n.
fn each_chunk(model: &dyn LanguageModel, window: &[u32], pass: &Pass, mut each: impl FnMut(usize, &Array) -> Result<()>) -> Result<()> {
    let mut caches = model.new_cache();
    let inputs = &window[..window.len() - 1];
    for start in (0..inputs.len()).step_by(pass.chunk) {
        let fed = &inputs[start..(start + pass.chunk).min(inputs.len())];
        let logits = model
            .forward(&Tokens::one(fed), CacheView::Rows(&mut [&mut caches]), &ALL)?
            .ok_or_else(|| Error::Internal("a forward returned no logits".into()))?;
        // As mlx-lm does, a cache is quantized after the model call that makes it due.
        if let Some(kv) = &pass.kv {
            kv.quantize_due(&mut caches)?;
        }
        each(start, &logits.reshape(&[fed.len() as i32, -1])?.as_dtype(Dtype::Float32)?)?;
    }
    // A window's caches and logits go back to the system before the next one is allocated.
    drop(caches);
    mlx_rs::memory::clear_cache()?;
    Ok(())
}

/// Evaluates `a` as u32 and copies it out (a strided view, such as a slice, in row order).
fn to_u32_vec(a: &Array) -> Result<Vec<u32>> {
    let a = a.as_dtype(Dtype::Uint32)?.contiguous()?;
    a.eval()?;
    Ok(a.as_slice::<u32>().to_vec())
}

/// Each scored token's negative log-likelihood (logsumexp − its logit, mlx-lm's cross-entropy),
/// window after window. `tick` counts positions done.
pub fn losses(model: &dyn LanguageModel, windows: &[&[u32]], pass: &Pass, tick: &dyn Fn(u64)) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for window in windows {
        each_chunk(model, window, pass, |start, logits| {
            let n = logits.shape()[0];
            let targets = Array::from_slice(&window[start + 1..start + 1 + n as usize], &[n, 1]);
            let picked = logits.take_along_axis(&targets, -1)?.reshape(&[n])?;
            out.extend(to_f32_vec(&ops::subtract(&logits.logsumexp_axis(-1, false)?, &picked)?)?);
            tick(n as u64);
            Ok(())
        })?;
    }
    Ok(out)
}

/// Writes every window's records: the `top_k` likeliest ids by descending logit (ties: the lower
/// id first, as an argmax picks), their logits and the full-vocabulary logsumexp.
pub fn write_dump(model: &dyn LanguageModel, windows: &[&[u32]], pass: &Pass, top_k: usize, writer: &DumpWriter, tick: &dyn Fn(u64)) -> Result<()> {
    let k = top_k;
    for (i, window) in windows.iter().enumerate() {
        let mut seq = writer.seq(i)?;
        each_chunk(model, window, pass, |_, logits| {
            let lse = logits.logsumexp_axis(-1, false)?;
            let idx = ops::argpartition_axis(&ops::negative(logits)?, k as i32 - 1, -1)?.index((.., ..k as i32));
            let vals = logits.take_along_axis(&idx, -1)?;
            eval([&lse, &idx, &vals])?;
            let (lse, idx, vals) = (to_f32_vec(&lse)?, to_u32_vec(&idx)?, to_f32_vec(&vals)?);
            for (r, &lse) in lse.iter().enumerate() {
                let (ids, logits) = (&idx[r * k..][..k], &vals[r * k..][..k]);
                let mut order: Vec<usize> = (0..k).collect();
                order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(ids[a].cmp(&ids[b])));
                let ids: Vec<u32> = order.iter().map(|&j| ids[j]).collect();
                let logits: Vec<f32> = order.iter().map(|&j| logits[j]).collect();
                seq.push(&ids, &logits, lse)?;
            }
            tick(lse.len() as u64);
            Ok(())
        })?;
        seq.finish()?;
    }
    Ok(())
}

/// Scores `model` against the first `seqs` sequences of `dump`: per position, the KL over the
/// reference's top-k, the mass it covers and whether the argmax agrees.
pub fn score(model: &dyn LanguageModel, dump: &Dump, seqs: usize, pass: &Pass, tick: &dyn Fn(u64)) -> Result<KlSummary> {
    let vocab = model.config().vocab_size;
    let k = dump.manifest.top_k as usize;
    let mut summary = KlSummary::default();
    for s in 0..seqs {
        let tokens = dump.tokens(s, vocab)?;
        let mut records = dump.records(s, vocab)?;
        each_chunk(model, &tokens, pass, |_, logits| {
            let n = logits.shape()[0];
            let rec = records.read(n as usize)?;
            let cand = logits.take_along_axis(&Array::from_slice(&rec.ids, &[n, k as i32]), -1)?;
            let lse = logits.logsumexp_axis(-1, false)?;
            let top = argmax_axis(logits, -1, false)?;
            eval([&cand, &lse, &top])?;
            let (cand, lse, top) = (to_f32_vec(&cand)?, to_f32_vec(&lse)?, to_u32_vec(&top)?);
            for r in 0..n as usize {
                let at = r * k..(r + 1) * k;
                let (kl, mass) = position_kl(&rec.logits[at.clone()], rec.lse[r], &cand[at], lse[r]);
                summary.push(kl, mass, top[r] == rec.ids[r * k]);
            }
            tick(n as u64);
            Ok(())
        })?;
    }
    Ok(summary)
}
