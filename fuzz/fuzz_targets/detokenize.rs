//! Arbitrary token ids (4 bytes each, any value) through SmolLM2's real tokenizer: decode with
//! and without special tokens, and the streaming detokenizer one id at a time. The tokenizer
//! comes from the GGUF at $MLX_BUN_FUZZ_GGUF (scripts/fuzz.sh sets it from the fixtures).
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mlx_bun::gguf::Gguf;
use mlx_bun::tokenizer::{detok::StreamDecoder, Tokenizer};

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = std::env::var_os("MLX_BUN_FUZZ_GGUF").expect("set MLX_BUN_FUZZ_GGUF to SmolLM2's GGUF");
        Tokenizer::from_gguf(&Gguf::open(std::path::Path::new(&path)).unwrap()).unwrap()
    })
}

// Loading the tokenizer takes about a second: done once before fuzzing, outside every run's
// time limit.
fuzz_target!(init: { tokenizer(); }, |data: &[u8]| {
    let tok = tokenizer();
    let ids: Vec<u32> = data.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let _ = tok.decode(&ids, false);
    let _ = tok.decode(&ids, true);
    let mut stream = StreamDecoder::new(tok, data.first().is_some_and(|b| b & 1 == 1));
    for &id in &ids {
        let _ = stream.push(id);
    }
    let _ = stream.finish();
});
