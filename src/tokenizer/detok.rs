//! Streaming detokenization: text for each generated token as soon as it is complete.
//!
//! Decoding tokens one by one is wrong twice over: a character may span several byte tokens
//! (byte-level BPE, SentencePiece byte fallback), and decoders such as SentencePiece's strip a
//! leading space only at the start of a text. So, as transformers' and mlx-lm's incremental
//! decoders do, the last emitted tokens are decoded again together with the new ones and only
//! the difference is emitted, and nothing is emitted while the text ends in U+FFFD (an
//! unfinished UTF-8 sequence). The window is a few tokens, so each step costs O(1).
use super::Tokenizer;
use crate::error::Result;

/// After this many tokens still ending in U+FFFD the bytes are not the start of a character
/// (a UTF-8 sequence has at most 4 bytes) and are emitted as they are.
const MAX_PENDING: usize = 8;

pub struct StreamDecoder {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// The window: tokens emitted last (`..read`), then those not emitted yet (`read..`).
    ids: Vec<u32>,
    read: usize,
}

impl StreamDecoder {
    pub fn new(tokenizer: &Tokenizer, skip_special_tokens: bool) -> Self {
        StreamDecoder { tokenizer: tokenizer.clone(), skip_special_tokens, ids: Vec::new(), read: 0 }
    }

    /// Adds a token; returns the text it completes, possibly empty.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let (prefix, text) = self.decode_window()?;
        if text.ends_with('\u{FFFD}') && self.ids.len() - self.read < MAX_PENDING {
            return Ok(String::new());
        }
        // The tokens just emitted become the context for the next step.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        Ok(new_suffix(&prefix, &text))
    }

    /// Whatever is still held back (an unfinished character comes out as U+FFFD); the decoder
    /// then starts afresh.
    pub fn finish(&mut self) -> Result<String> {
        let (prefix, text) = self.decode_window()?;
        self.ids.clear();
        self.read = 0;
        Ok(new_suffix(&prefix, &text))
    }

    /// The text of the emitted tokens alone, and with the pending ones.
    fn decode_window(&self) -> Result<(String, String)> {
        let prefix = self.tokenizer.decode(&self.ids[..self.read], self.skip_special_tokens)?;
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        Ok((prefix, text))
    }
}

/// `text` minus the part already emitted as `prefix`. If the two disagree (a forced U+FFFD that
/// later bytes turned into a character), the text after their common part is emitted.
fn new_suffix(prefix: &str, text: &str) -> String {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest.to_owned();
    }
    let common = prefix
        .char_indices()
        .zip(text.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prefix.len().min(text.len()), |((i, _), _)| i);
    text.get(common..).unwrap_or_default().to_owned()
}
