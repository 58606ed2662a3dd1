//! Any bytes as a .gguf file: header, metadata, tensor table, the config built from them, the
//! tensors' conversion, the embedded tokenizer and chat template. Errors are fine; a panic, a
//! hang or unbounded memory is a bug.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlx_bun::gguf::Gguf;
use mlx_bun::model::gguf_weights;
use mlx_bun::tokenizer::{template::ChatTemplate, Tokenizer};

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("mlx-bun-fuzz-{}.gguf", std::process::id()));
    std::fs::write(&path, data).unwrap();
    let Ok(g) = Gguf::open(&path) else { return };
    let _ = gguf_weights::config(&g);
    let _ = gguf_weights::load(&g);
    let _ = Tokenizer::from_gguf(&g);
    if let Ok(Some(t)) = ChatTemplate::from_gguf(&g) {
        let _ = t.render(&serde_json::json!([{"role": "user", "content": "hi"}]), &Default::default());
    }
});
