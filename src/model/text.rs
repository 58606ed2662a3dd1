//! `loadModelConfig().text`, the sizes `fit` reads (for a loaded model too: the CLI and the
//! server read them here, so every surface bills the same geometry).
use serde_json::{json, Value};

use super::config::ModelConfig;
use super::sliding_layers;

/// mlx-bun's `TextConfig`: the language model's sizes under its camelCase names, from
/// `text_config` for multimodal checkpoints, else the top level; the sizes the engine parsed
/// (with their defaults) where it parses them, mlx-bun's defaults for the rest.
pub fn text_config(c: &ModelConfig) -> Value {
    let t = c.raw.get("text_config").filter(|v| v.is_object()).unwrap_or(&c.raw);
    let get = |k: &str| t.get(k).filter(|v| !v.is_null()).or_else(|| c.raw.get(k).filter(|v| !v.is_null()));
    let num = |k: &str, default: Value| get(k).cloned().unwrap_or(default);
    let kv_heads = c.num_key_value_heads;
    // What the engine builds, where it implements the architecture (Gemma 3 slides by its
    // pattern, whatever `layer_types` says); else the config's own list, as mlx-bun reads it.
    let (layer_types, sliding_window) = match sliding_layers(c) {
        Ok(s) => {
            let mut kinds: Vec<&str> = s.layers.iter().map(|&slides| if slides { "sliding_attention" } else { "full_attention" }).collect();
            // Qwen3.5 / Qwen3-Next: linear-attention layers hold a recurrent state, not keys.
            if let (true, Ok(linear)) = (super::restores_checkpoints(c), super::qwen3_next::linear_layers(c)) {
                for (kind, _) in kinds.iter_mut().zip(linear).filter(|(_, l)| *l) {
                    *kind = "linear_attention";
                }
            }
            let window = if s.layers.contains(&true) { json!(s.window) } else { num("sliding_window", json!(0)) };
            (json!(kinds), window)
        }
        Err(_) => (get("layer_types").cloned().unwrap_or_else(|| json!([])), num("sliding_window", json!(0))),
    };
    // Gemma 4 without `rope_parameters` gets mlx-lm's.
    let gemma4_default = c.model_type.starts_with("gemma4").then(super::gemma4_text::default_rope_parameters);
    let rope = match get("rope_parameters").or(gemma4_default.as_ref()).and_then(Value::as_object) {
        Some(kinds) => kinds
            .iter()
            .map(|(kind, p)| {
                let f = |k: &str, d: Value| p.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(d);
                (kind.clone(), json!({"ropeTheta": f("rope_theta", json!(c.rope_theta)), "ropeType": f("rope_type", json!("default")), "partialRotaryFactor": f("partial_rotary_factor", json!(1.0)), "factor": f("factor", json!(1.0))}))
            })
            .collect(),
        None => {
            let scaling = c.raw.get("rope_scaling").filter(|v| v.is_object());
            let s = |k: &str, d: Value| scaling.and_then(|r| r.get(k)).filter(|v| !v.is_null()).cloned().unwrap_or(d);
            let kind = s("rope_type", s("type", json!("default")));
            let mut one = serde_json::Map::new();
            one.insert("full_attention".into(), json!({"ropeTheta": c.rope_theta, "ropeType": kind, "partialRotaryFactor": num("partial_rotary_factor", json!(1.0)), "factor": s("factor", json!(1.0))}));
            one
        }
    };
    json!({
        "hiddenSize": c.hidden_size,
        "numHiddenLayers": c.num_hidden_layers,
        "numAttentionHeads": c.num_attention_heads,
        "numKeyValueHeads": kv_heads,
        "headDim": c.head_dim,
        "numGlobalKeyValueHeads": num("num_global_key_value_heads", json!(kv_heads)),
        "globalHeadDim": num("global_head_dim", json!(c.head_dim)),
        "attentionKEqV": num("attention_k_eq_v", json!(false)),
        "intermediateSize": c.intermediate_size,
        "hiddenActivation": get("hidden_activation").or_else(|| get("hidden_act")).cloned().unwrap_or(json!("gelu_pytorch_tanh")),
        "rmsNormEps": c.rms_norm_eps,
        "vocabSize": c.vocab_size,
        "maxPositionEmbeddings": c.max_position_embeddings,
        "slidingWindow": sliding_window,
        "layerTypes": layer_types,
        "hiddenSizePerLayerInput": num("hidden_size_per_layer_input", json!(0)),
        "vocabSizePerLayerInput": num("vocab_size_per_layer_input", json!(c.vocab_size)),
        // mlx-lm's Gemma 4 shares the last 20 layers' keys and values unless the config says.
        "numKvSharedLayers": num("num_kv_shared_layers", json!(if c.model_type.starts_with("gemma4") { 20 } else { 0 })),
        // Gemma 4's names, else Qwen's (`num_experts_per_tok`: a Qwen MoE always routes).
        "enableMoeBlock": num("enable_moe_block", json!(get("num_experts_per_tok").is_some())),
        "numExperts": num("num_experts", json!(0)),
        "topKExperts": num("top_k_experts", num("num_experts_per_tok", json!(0))),
        "moeIntermediateSize": num("moe_intermediate_size", json!(0)),
        "linearNumValueHeads": num("linear_num_value_heads", json!(0)),
        "linearNumKeyHeads": num("linear_num_key_heads", json!(0)),
        "linearKeyHeadDim": num("linear_key_head_dim", json!(0)),
        "linearValueHeadDim": num("linear_value_head_dim", json!(0)),
        "linearConvKernelDim": num("linear_conv_kernel_dim", json!(0)),
        "ropeParameters": rope,
        "finalLogitSoftcapping": get("final_logit_softcapping").cloned(),
        "tieWordEmbeddings": get("tie_word_embeddings").cloned().unwrap_or(json!(false)),
        "bosTokenId": get("bos_token_id").cloned(),
        "eosTokenId": get("eos_token_id").cloned(),
    })
}
