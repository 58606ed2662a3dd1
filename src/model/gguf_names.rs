//! llama.cpp's tensor names (`blk.N.attn_q.weight`, …) to the HF names of the same tensors,
//! per architecture: the layouts its converter (convert_hf_to_gguf.py) writes.
use super::gguf_config::Arch;

/// The HF name of GGUF tensor `gguf` in a file of architecture `arch`, if it is one we read.
pub(super) fn hf_name(arch: Arch, gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output_norm.bias" => return Some("model.norm.bias".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let mut parts = gguf.splitn(4, '.');
    let (blk, i, base, suffix) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if blk != "blk" {
        return None;
    }
    let module = match (arch, base) {
        (_, "attn_norm") => "input_layernorm",
        (Arch::Llama | Arch::Granite | Arch::Gemma | Arch::Starcoder2 | Arch::Qwen2 | Arch::Phi3 | Arch::Smollm3 | Arch::Glm4 | Arch::Minicpm, "ffn_norm") => {
            "post_attention_layernorm"
        }
        // GLM-4's sandwich norms: after attention, and after the MLP.
        (Arch::Glm4, "post_attention_norm") => "post_self_attn_layernorm",
        (Arch::Glm4, "post_ffw_norm") => "post_mlp_layernorm",
        // Phi-3's fused q/k/v, and Phi-3's and GLM-4's fused gate and up projections (gate rows
        // first), kept fused as mlx-lm keeps them.
        (Arch::Phi3, "attn_qkv") => "self_attn.qkv_proj",
        (Arch::Phi3 | Arch::Glm4, "ffn_up") => "mlp.gate_up_proj",
        // Gemma 2 and 3 norm before and after attention and the MLP, OLMo 2 only after.
        (Arch::Gemma2 | Arch::Gemma3 | Arch::Olmo2, "post_attention_norm") => "post_attention_layernorm",
        (Arch::Gemma2 | Arch::Gemma3, "ffn_norm") => "pre_feedforward_layernorm",
        (Arch::Gemma2 | Arch::Gemma3 | Arch::Olmo2, "post_ffw_norm") => "post_feedforward_layernorm",
        (Arch::Gemma3 | Arch::Olmo2 | Arch::Qwen3 | Arch::Qwen3Moe, "attn_q_norm") => "self_attn.q_norm",
        (Arch::Gemma3 | Arch::Olmo2 | Arch::Qwen3 | Arch::Qwen3Moe, "attn_k_norm") => "self_attn.k_norm",
        (Arch::Qwen3 | Arch::Qwen3Moe, "ffn_norm") => "post_attention_layernorm",
        // Qwen3-MoE's router and its experts, stacked [experts, out, in] as mlx-lm's switch_mlp.
        (Arch::Qwen3Moe, "ffn_gate_inp") => "mlp.gate",
        (Arch::Qwen3Moe, "ffn_gate_exps") => "mlp.switch_mlp.gate_proj",
        (Arch::Qwen3Moe, "ffn_up_exps") => "mlp.switch_mlp.up_proj",
        (Arch::Qwen3Moe, "ffn_down_exps") => "mlp.switch_mlp.down_proj",
        // StarCoder 2's plain MLP.
        (Arch::Starcoder2, "ffn_up") => "mlp.c_fc",
        (Arch::Starcoder2, "ffn_down") => "mlp.c_proj",
        (_, "attn_q") => "self_attn.q_proj",
        (_, "attn_k") => "self_attn.k_proj",
        (_, "attn_v") => "self_attn.v_proj",
        (_, "attn_output") => "self_attn.o_proj",
        (_, "ffn_gate") => "mlp.gate_proj",
        (_, "ffn_up") => "mlp.up_proj",
        (_, "ffn_down") => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{i}.{module}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hf() {
        assert_eq!(hf_name(Arch::Llama, "blk.3.attn_q.weight").unwrap(), "model.layers.3.self_attn.q_proj.weight");
        assert_eq!(hf_name(Arch::Llama, "blk.0.ffn_norm.weight").unwrap(), "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(hf_name(Arch::Llama, "token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(hf_name(Arch::Llama, "blk.0.unknown.weight"), None);
        assert_eq!(hf_name(Arch::Qwen2, "blk.1.attn_k.bias").unwrap(), "model.layers.1.self_attn.k_proj.bias");
        assert_eq!(hf_name(Arch::Qwen2, "blk.1.ffn_norm.weight").unwrap(), "model.layers.1.post_attention_layernorm.weight");
        // Fused projections stay fused; GLM-4's sandwich norms; no fused names elsewhere.
        assert_eq!(hf_name(Arch::Phi3, "blk.0.attn_qkv.weight").unwrap(), "model.layers.0.self_attn.qkv_proj.weight");
        assert_eq!(hf_name(Arch::Phi3, "blk.0.ffn_up.weight").unwrap(), "model.layers.0.mlp.gate_up_proj.weight");
        assert_eq!(hf_name(Arch::Glm4, "blk.0.ffn_up.weight").unwrap(), "model.layers.0.mlp.gate_up_proj.weight");
        assert_eq!(hf_name(Arch::Glm4, "blk.0.post_attention_norm.weight").unwrap(), "model.layers.0.post_self_attn_layernorm.weight");
        assert_eq!(hf_name(Arch::Glm4, "blk.0.ffn_norm.weight").unwrap(), "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(hf_name(Arch::Glm4, "blk.0.post_ffw_norm.weight").unwrap(), "model.layers.0.post_mlp_layernorm.weight");
        assert_eq!(hf_name(Arch::Llama, "blk.0.attn_qkv.weight"), None);
        assert_eq!(hf_name(Arch::Smollm3, "blk.0.ffn_up.weight").unwrap(), "model.layers.0.mlp.up_proj.weight");
    }

    #[test]
    fn gemma3_names_map_to_hf() {
        let cases = [
            ("blk.2.attn_norm.weight", "model.layers.2.input_layernorm.weight"),
            ("blk.2.post_attention_norm.weight", "model.layers.2.post_attention_layernorm.weight"),
            ("blk.2.ffn_norm.weight", "model.layers.2.pre_feedforward_layernorm.weight"),
            ("blk.2.post_ffw_norm.weight", "model.layers.2.post_feedforward_layernorm.weight"),
            ("blk.2.attn_q_norm.weight", "model.layers.2.self_attn.q_norm.weight"),
            ("blk.2.attn_k_norm.weight", "model.layers.2.self_attn.k_norm.weight"),
            ("blk.2.attn_output.weight", "model.layers.2.self_attn.o_proj.weight"),
            ("blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight"),
            ("output_norm.weight", "model.norm.weight"),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_name(Arch::Gemma3, gguf).as_deref(), Some(hf), "{gguf}");
        }
        // Names of the other architecture do not leak across.
        assert_eq!(hf_name(Arch::Llama, "blk.0.post_ffw_norm.weight"), None);
    }

    #[test]
    fn gemma_and_gemma2_names_map_to_hf() {
        // Gemma's ffn_norm is its pre-MLP norm; Gemma 2 has Gemma 3's four norms per layer.
        assert_eq!(hf_name(Arch::Gemma, "blk.1.ffn_norm.weight").as_deref(), Some("model.layers.1.post_attention_layernorm.weight"));
        assert_eq!(hf_name(Arch::Gemma2, "blk.1.ffn_norm.weight").as_deref(), Some("model.layers.1.pre_feedforward_layernorm.weight"));
        assert_eq!(hf_name(Arch::Gemma2, "blk.1.post_ffw_norm.weight").as_deref(), Some("model.layers.1.post_feedforward_layernorm.weight"));
        assert_eq!(hf_name(Arch::Gemma2, "blk.1.post_attention_norm.weight").as_deref(), Some("model.layers.1.post_attention_layernorm.weight"));
        assert_eq!(hf_name(Arch::Gemma, "blk.1.post_ffw_norm.weight"), None);
    }

    #[test]
    fn olmo2_and_starcoder2_names_map_to_hf() {
        let cases = [
            (Arch::Olmo2, "blk.0.post_attention_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
            (Arch::Olmo2, "blk.0.post_ffw_norm.weight", "model.layers.0.post_feedforward_layernorm.weight"),
            (Arch::Olmo2, "blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
            (Arch::Starcoder2, "blk.0.attn_norm.bias", "model.layers.0.input_layernorm.bias"),
            (Arch::Starcoder2, "blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
            (Arch::Starcoder2, "blk.0.ffn_up.bias", "model.layers.0.mlp.c_fc.bias"),
            (Arch::Starcoder2, "blk.0.ffn_down.weight", "model.layers.0.mlp.c_proj.weight"),
            (Arch::Starcoder2, "blk.0.attn_output.bias", "model.layers.0.self_attn.o_proj.bias"),
            (Arch::Starcoder2, "output_norm.bias", "model.norm.bias"),
        ];
        for (arch, gguf, hf) in cases {
            assert_eq!(hf_name(arch, gguf).as_deref(), Some(hf), "{gguf}");
        }
        // OLMo 2 has no pre-norms.
        assert_eq!(hf_name(Arch::Olmo2, "blk.0.ffn_norm.weight"), None);
    }
}
