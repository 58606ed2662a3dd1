//! Forwards over prompts outside any session, run as tasks in steps on the engine thread
//! (`ExecutionTasks::enqueue_steps`): `Model.logits` and embeddings. A long prompt is prefilled
//! one chunk per turn (mlx-lm's 2048 tokens, as a generation's prefill), so sessions and other
//! tasks go on between chunks, and each chunk checks for an exit or a fork between its layers.
use super::models::{lookup, ModelId, Models};
use super::rows;
use crate::cache::{CacheView, LayerCache};
use crate::error::{Error, Result};
use crate::mlx::host;
use crate::model::{LanguageModel, Logits, StepContext, Tokens};
use crate::sample::{validate_prompt, GenerateOptions};

fn chunk() -> usize {
    GenerateOptions::default().prefill_chunk_size as usize
}

/// Fills caches without asking for an output, layer by layer, checking for an exit or a fork
/// between layers as a prefill does.
const FILL: StepContext<'static> = StepContext { logits: Logits::None, check: Some(&rows::between_parts) };

/// `Model.logits`: the last position's logits of a prompt on a fresh cache. A prompt of one
/// chunk is one forward.
pub(super) struct PromptLogits {
    pub models: Models,
    pub model: ModelId,
    pub prompt: Vec<u32>,
    pub done: usize,
    pub caches: Option<Vec<LayerCache>>,
}

impl PromptLogits {
    pub fn step(&mut self) -> Result<Option<Vec<f32>>> {
        let model = lookup(&self.models, self.model)?;
        let caches = match &mut self.caches {
            Some(c) => c,
            None => {
                validate_prompt(&self.prompt, model.config().vocab_size)?;
                self.caches.insert(model.new_cache())
            }
        };
        let end = (self.done + chunk()).min(self.prompt.len());
        let tokens = Tokens::one(&self.prompt[self.done..end]);
        if end < self.prompt.len() {
            model.forward(&tokens, CacheView::Rows(&mut [caches]), &FILL)?;
            mlx_rs::memory::clear_cache()?;
            self.done = end;
            return Ok(None);
        }
        let logits = model
            .forward(&tokens, CacheView::Rows(&mut [caches]), &StepContext::LAST)?
            .ok_or_else(|| Error::Internal("a forward returned no logits".into()))?;
        host::to_f32_vec(&logits).map(Some)
    }
}

/// Rows per padded batch, and padded tokens (rows × the longest) per batch: bounds on the
/// activations one forward holds, whatever the caller sends.
const BATCH_ROWS: usize = 32;
const BATCH_TOKENS: usize = 8192;

/// Embeddings (mlx-bun's `embedPooled`): each row's last hidden state, L2-normalised. Rows are
/// taken shortest first into padded batches (each one forward over [rows, longest], left
/// padding never attended to); a batch longer than a chunk is fed chunk by chunk, every row's
/// chunks aligned on its end so that all rows finish in the same last forward.
pub(super) struct PromptEmbeddings {
    models: Models,
    model: ModelId,
    rows: Vec<Vec<u32>>,
    /// Row indices, shortest first; `next` is the first not yet in a batch.
    order: Vec<usize>,
    next: usize,
    batch: Option<Batch>,
    vectors: Vec<Vec<f32>>,
}

struct Batch {
    members: Vec<usize>,
    caches: Vec<Vec<LayerCache>>,
    /// Chunks of the longest row, and how many were fed.
    chunks: usize,
    fed: usize,
}

impl PromptEmbeddings {
    pub fn new(models: Models, model: ModelId, rows: Vec<Vec<u32>>) -> Self {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| rows[i].len());
        let vectors = vec![Vec::new(); rows.len()];
        PromptEmbeddings { models, model, rows, order, next: 0, batch: None, vectors }
    }

    /// The next rows to run together (shortest first, within the batch limits); `None` once
    /// every row has run.
    fn form_batch(&mut self, model: &dyn LanguageModel) -> Option<Batch> {
        let mut members = Vec::new();
        for &i in &self.order[self.next..] {
            // Shortest first: this row is the batch's longest so far.
            let padded = (members.len() + 1) * self.rows[i].len();
            if !members.is_empty() && (members.len() == BATCH_ROWS || padded > BATCH_TOKENS) {
                break;
            }
            members.push(i);
        }
        self.next += members.len();
        let longest = self.rows[*members.last()?].len();
        let caches = members.iter().map(|_| model.new_cache()).collect();
        Some(Batch { members, caches, chunks: longest.div_ceil(chunk()), fed: 0 })
    }

    pub fn step(&mut self) -> Result<Option<Vec<Vec<f32>>>> {
        let model = lookup(&self.models, self.model)?;
        if self.next == 0 && self.batch.is_none() {
            for row in &self.rows {
                validate_prompt(row, model.config().vocab_size)?;
            }
        }
        let batch = match self.batch.as_mut() {
            Some(batch) => batch,
            None => match self.form_batch(&*model) {
                Some(batch) => self.batch.insert(batch),
                None => return Ok(Some(std::mem::take(&mut self.vectors))),
            },
        };
        // Chunk k of row i ends `chunks - 1 - k` chunks before the row's end.
        let before_end = (batch.chunks - 1 - batch.fed) * chunk();
        let mut fed: Vec<&[u32]> = Vec::new();
        let mut caches: Vec<&mut [LayerCache]> = Vec::new();
        for (&i, c) in batch.members.iter().zip(batch.caches.iter_mut()) {
            let row = &self.rows[i];
            let end = row.len().saturating_sub(before_end);
            if end > 0 {
                fed.push(&row[end.saturating_sub(chunk())..end]);
                caches.push(c.as_mut_slice());
            }
        }
        let tokens = Tokens::ragged(&fed);
        batch.fed += 1;
        if batch.fed < batch.chunks {
            model.forward(&tokens, CacheView::Rows(&mut caches), &FILL)?;
            mlx_rs::memory::clear_cache()?;
            return Ok(None);
        }
        // The last chunk: every row of the batch has its end in it.
        let ctx = StepContext { logits: Logits::LastHidden, check: None };
        let hidden = model.forward(&tokens, CacheView::Rows(&mut caches), &ctx)?.ok_or_else(|| Error::Internal("a forward returned no hidden states".into()))?;
        let hidden = host::to_f32_vec(&hidden)?;
        let width = hidden.len() / batch.members.len();
        for (&i, h) in batch.members.iter().zip(hidden.chunks_exact(width)) {
            self.vectors[i] = l2_normalised(h);
        }
        self.batch = None;
        mlx_rs::memory::clear_cache()?;
        Ok(None)
    }
}

/// `v / ‖v‖` (a zero vector stays zero), the norm summed in f64.
pub fn l2_normalised(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|&x| (x as f64 / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_normalised_has_unit_norm_and_keeps_zero() {
        let v = l2_normalised(&[3.0, 4.0]);
        assert_eq!(v, vec![0.6, 0.8]);
        assert_eq!(l2_normalised(&[0.0, 0.0]), vec![0.0, 0.0]);
    }
}
