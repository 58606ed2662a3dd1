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
        StreamDecoder {
            tokenizer: tokenizer.clone(),
            skip_special_tokens,
            ids: Vec::new(),
            read: 0,
        }
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
        let prefix = self
            .tokenizer
            .decode(&self.ids[..self.read], self.skip_special_tokens)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::gguf::tests::{byte_id, byte_level_gguf, load, spm_gguf, HELLO, WORLD};

    fn stream(tok: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
        let mut d = StreamDecoder::new(tok, skip_special_tokens);
        let mut out: Vec<String> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
        out.push(d.finish().unwrap());
        out
    }

    #[test]
    fn byte_level_characters_are_never_split() {
        let tok = load(&byte_level_gguf("gpt-2", None)).unwrap();
        let text = "hello wörld 世界🤗!";
        let ids = tok.encode(text, false).unwrap();
        let pieces = stream(&tok, &ids, false);
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
        // 🤗 is four byte tokens: nothing, nothing, nothing, then the whole character.
        let emoji: Vec<u32> = "🤗".bytes().map(byte_id).collect();
        assert_eq!(stream(&tok, &emoji, false), ["", "", "", "🤗", ""]);
    }

    #[test]
    fn byte_fallback_and_leading_spaces() {
        let tok = load(&spm_gguf(false)).unwrap();
        // é as <0xC3><0xA9>
        assert_eq!(
            stream(&tok, &[261, 199, 173, 266, 264], false),
            ["h", "", "é", "ll", "o", ""]
        );
        // SentencePiece strips the space of the first token only; later ones keep theirs.
        let tok = load(&spm_gguf(true)).unwrap();
        assert_eq!(
            stream(&tok, &[269, 269, 269], false),
            ["hello", " hello", " hello", ""]
        );
    }

    #[test]
    fn special_tokens_follow_the_skip_flag() {
        let tok = load(&byte_level_gguf("gpt-2", None)).unwrap();
        assert_eq!(stream(&tok, &[1, HELLO, 2], true), ["", "hello", "", ""]);
        assert_eq!(
            stream(&tok, &[1, HELLO, 2], false),
            ["<|im_start|>", "hello", "<|im_end|>", ""]
        );
    }

    #[test]
    fn invalid_bytes_are_flushed_and_finish_drains() {
        let tok = load(&byte_level_gguf("gpt-2", None)).unwrap();
        let mut d = StreamDecoder::new(&tok, false);
        let held: String = (0..MAX_PENDING - 1)
            .map(|_| d.push(byte_id(0xFF)).unwrap())
            .collect();
        assert_eq!(held, "");
        assert_eq!(
            d.push(byte_id(0xFF)).unwrap(),
            "\u{FFFD}".repeat(MAX_PENDING)
        );
        // An unfinished character at the end comes out as U+FFFD rather than being lost.
        assert_eq!(d.push(byte_id(0xE4)).unwrap(), "");
        assert_eq!(d.finish().unwrap(), "\u{FFFD}");
        assert_eq!(d.push(HELLO).unwrap(), "hello");
    }

    #[test]
    fn window_stays_bounded() {
        let tok = load(&byte_level_gguf("gpt-2", None)).unwrap();
        let mut d = StreamDecoder::new(&tok, false);
        let mut text = String::new();
        for i in 0..2000 {
            let id = if i % 3 == 0 {
                byte_id(0xC3)
            } else if i % 3 == 1 {
                byte_id(0xA9)
            } else {
                WORLD
            };
            text += &d.push(id).unwrap();
            assert!(
                d.ids.len() <= 2 * MAX_PENDING,
                "window grew to {}",
                d.ids.len()
            );
        }
        text += &d.finish().unwrap();
        assert_eq!(text, "é world".repeat(2000 / 3) + "é");
    }
}
