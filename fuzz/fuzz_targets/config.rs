//! Any bytes as a config.json: parsing, validation and the derived sizes (quantization, RoPE
//! scaling, head sizes). Errors are fine; a panic is a bug.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlx_bun::model::config::ModelConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    if let Ok(c) = ModelConfig::from_value(v, "config.json".into()) {
        if let Some(q) = &c.quantization {
            std::hint::black_box(q.params_for("model.layers.0.mlp.up_proj"));
        }
        std::hint::black_box(c.model_path());
    }
});
