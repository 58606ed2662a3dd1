//! The cache of a linear-attention layer (Qwen3.5 / Qwen3-Next's gated DeltaNet, mlx-lm's
//! `ArraysCache(size=2)`): not keys and values per position but a fixed-size summary of every
//! position seen: the last `kernel - 1` inputs of the layer's causal convolution, and the
//! recurrent state [1, heads, value_dim, key_dim] the delta rule updates token by token.
//!
//! A summary cannot forget its last positions, so it is never trimmed: speculative decoding
//! cannot rewind it, and the prefix cache restores it only at the exact positions it was saved
//! at (a checkpoint), never from a longer entry.
use mlx_rs::Array;

/// Cloning is a snapshot: every step replaces both arrays rather than writing into them.
#[derive(Default, Clone)]
pub struct RecurrentCache {
    conv: Option<Array>,
    state: Option<Array>,
    offset: usize,
}

impl RecurrentCache {
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Part 0, the convolution inputs, or part 1, the recurrent state, after the positions seen
    /// so far (`None` before the first).
    pub fn get_part(&self, part: usize) -> Option<&Array> {
        if part == 0 { self.conv.as_ref() } else { self.state.as_ref() }
    }

    /// Records a step of `n` positions that left `conv` and `state`.
    pub fn set(&mut self, conv: Array, state: Array, n: usize) {
        self.conv = Some(conv);
        self.state = Some(state);
        self.offset += n;
    }

    /// A cache that has seen `offset` positions, leaving these convolution inputs and state
    /// (`None` before the first).
    pub fn restored(parts: Option<(Array, Array)>, offset: usize) -> Self {
        let (conv, state) = parts.unzip();
        RecurrentCache { conv, state, offset }
    }

    pub fn state(&self) -> Vec<&Array> {
        self.conv.iter().chain(self.state.iter()).collect()
    }
}
