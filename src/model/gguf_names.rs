//! llama.cpp's tensor names (`blk.N.attn_q.weight`, …) to the HF names of the same tensors,
//! per architecture: the layouts its converter (convert_hf_to_gguf.py) writes.
use super::gguf_config::Arch;

/// The HF name of GGUF tensor `gguf` in a file of architecture `arch`, if it is one we read.
pub(super) fn hf_name(arch: Arch, gguf: &str) -> Option<String> {
    if arch == Arch::Gemma4 {
        // Gemma 4's per-layer inputs: one embedding per layer for each token, and a projection of
        // the main embedding into the same per-layer space.
        match gguf {
            "per_layer_token_embd.weight" => return Some("model.embed_tokens_per_layer.weight".into()),
            "per_layer_model_proj.weight" => return Some("model.per_layer_model_projection.weight".into()),
            "per_layer_proj_norm.weight" => return Some("model.per_layer_projection_norm.weight".into()),
            _ => {}
        }
    }
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output_norm.bias" => return Some("model.norm.bias".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let mut parts = gguf.splitn(4, '.');
    let (blk, i, base) = (parts.next()?, parts.next()?, parts.next()?);
    // `ssm_a` alone has no `.weight`.
    let suffix = parts.next().unwrap_or("");
    if blk != "blk" {
        return None;
    }
    // Qwen3-Next and Qwen3.5 share llama.cpp's names.
    let hybrid = matches!(arch, Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe);
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
        // Gemma 2, 3 and 4 norm before and after attention and the MLP; OLMo 2, Qwen3-Next and
        // Qwen3.5 only after attention (OLMo 2 also after the MLP).
        (Arch::Gemma2 | Arch::Gemma3 | Arch::Gemma4 | Arch::Olmo2 | Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe, "post_attention_norm") => {
            "post_attention_layernorm"
        }
        (Arch::Gemma2 | Arch::Gemma3 | Arch::Gemma4, "ffn_norm") => "pre_feedforward_layernorm",
        (Arch::Gemma2 | Arch::Gemma3 | Arch::Gemma4 | Arch::Olmo2, "post_ffw_norm") => "post_feedforward_layernorm",
        (Arch::Gemma3 | Arch::Gemma4 | Arch::Olmo2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe, "attn_q_norm") => {
            "self_attn.q_norm"
        }
        (Arch::Gemma3 | Arch::Gemma4 | Arch::Olmo2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe, "attn_k_norm") => {
            "self_attn.k_norm"
        }
        (Arch::Qwen3 | Arch::Qwen3Moe, "ffn_norm") => "post_attention_layernorm",
        // Qwen3-MoE's, Qwen3-Next's and Qwen3.5's routers and experts, stacked [experts, out, in]
        // as mlx-lm's switch_mlp, and the latter two's gated shared expert.
        (Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe, "ffn_gate_inp") => "mlp.gate",
        (Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe, "ffn_gate_exps") => "mlp.switch_mlp.gate_proj",
        (Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe, "ffn_up_exps") => "mlp.switch_mlp.up_proj",
        (Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35 | Arch::Qwen35Moe, "ffn_down_exps") => "mlp.switch_mlp.down_proj",
        (_, "ffn_gate_inp_shexp") if hybrid => "mlp.shared_expert_gate",
        (_, "ffn_gate_shexp") if hybrid => "mlp.shared_expert.gate_proj",
        (_, "ffn_up_shexp") if hybrid => "mlp.shared_expert.up_proj",
        (_, "ffn_down_shexp") if hybrid => "mlp.shared_expert.down_proj",
        // Qwen3-Next's and Qwen3.5's linear-attention layers (llama.cpp's "ssm" names;
        // gguf_hybrid.rs restores their values and layouts).
        (_, "attn_qkv") if hybrid => "linear_attn.in_proj_qkv",
        (_, "attn_gate") if hybrid => "linear_attn.in_proj_z",
        // Files converted before llama.cpp split it: Qwen3-Next's own fused projection.
        (_, "ssm_in") if hybrid => "linear_attn.in_proj_qkvz",
        (_, "ssm_ba") if hybrid => "linear_attn.in_proj_ba",
        (_, "ssm_beta") if hybrid => "linear_attn.in_proj_b",
        (_, "ssm_alpha") if hybrid => "linear_attn.in_proj_a",
        (_, "ssm_conv1d") if hybrid => "linear_attn.conv1d",
        (_, "ssm_norm") if hybrid => "linear_attn.norm",
        (_, "ssm_out") if hybrid => "linear_attn.out_proj",
        (_, "ssm_dt") if hybrid && suffix == "bias" => return Some(format!("model.layers.{i}.linear_attn.dt_bias")),
        (_, "ssm_a") if hybrid && suffix.is_empty() => return Some(format!("model.layers.{i}.linear_attn.A_log")),
        // Gemma 4's MoE layers: the dense MLP's post-norm (_1), the experts' pre- and post-norms
        // (_2), the router (its projection and input scale; the experts' output scales stored
        // beside the down projections), the experts with gate and up fused (gate rows first);
        // each layer's per-layer-input gate, projection and norm; a learned output scalar.
        (Arch::Gemma4, "post_ffw_norm_1") => "post_feedforward_layernorm_1",
        (Arch::Gemma4, "pre_ffw_norm_2") => "pre_feedforward_layernorm_2",
        (Arch::Gemma4, "post_ffw_norm_2") => "post_feedforward_layernorm_2",
        (Arch::Gemma4, "ffn_gate_inp") if suffix == "weight" => "router.proj",
        (Arch::Gemma4, "ffn_gate_inp") if suffix == "scale" => return Some(format!("model.layers.{i}.router.scale")),
        (Arch::Gemma4, "ffn_down_exps") if suffix == "scale" => return Some(format!("model.layers.{i}.router.per_expert_scale")),
        (Arch::Gemma4, "ffn_down_exps") => "experts.switch_glu.down_proj",
        (Arch::Gemma4, "ffn_gate_up_exps") => "experts.switch_glu.gate_up_proj",
        (Arch::Gemma4, "inp_gate") => "per_layer_input_gate",
        (Arch::Gemma4, "proj") => "per_layer_projection",
        (Arch::Gemma4, "post_norm") => "post_per_layer_input_norm",
        (Arch::Gemma4, "layer_output_scale") if suffix == "weight" => return Some(format!("model.layers.{i}.layer_scalar")),
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
    (!suffix.is_empty()).then(|| format!("model.layers.{i}.{module}.{suffix}"))
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
    fn qwen3_next_and_qwen35_names_map_to_hf() {
        let cases = [
            (Arch::Qwen3Next, "blk.0.attn_qkv.weight", "model.layers.0.linear_attn.in_proj_qkv.weight"),
            (Arch::Qwen3Next, "blk.0.attn_gate.weight", "model.layers.0.linear_attn.in_proj_z.weight"),
            (Arch::Qwen3Next, "blk.0.ssm_in.weight", "model.layers.0.linear_attn.in_proj_qkvz.weight"),
            (Arch::Qwen3Next, "blk.0.ssm_ba.weight", "model.layers.0.linear_attn.in_proj_ba.weight"),
            (Arch::Qwen35, "blk.0.ssm_beta.weight", "model.layers.0.linear_attn.in_proj_b.weight"),
            (Arch::Qwen35, "blk.0.ssm_alpha.weight", "model.layers.0.linear_attn.in_proj_a.weight"),
            (Arch::Qwen35, "blk.0.ssm_a", "model.layers.0.linear_attn.A_log"),
            (Arch::Qwen35, "blk.0.ssm_dt.bias", "model.layers.0.linear_attn.dt_bias"),
            (Arch::Qwen35, "blk.0.ssm_conv1d.weight", "model.layers.0.linear_attn.conv1d.weight"),
            (Arch::Qwen35, "blk.0.ssm_norm.weight", "model.layers.0.linear_attn.norm.weight"),
            (Arch::Qwen35, "blk.0.ssm_out.weight", "model.layers.0.linear_attn.out_proj.weight"),
            (Arch::Qwen35, "blk.3.post_attention_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
            (Arch::Qwen35, "blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"),
            (Arch::Qwen35Moe, "blk.1.ffn_gate_inp_shexp.weight", "model.layers.1.mlp.shared_expert_gate.weight"),
            (Arch::Qwen35Moe, "blk.1.ffn_down_shexp.weight", "model.layers.1.mlp.shared_expert.down_proj.weight"),
            (Arch::Qwen3Next, "blk.1.ffn_up_exps.weight", "model.layers.1.mlp.switch_mlp.up_proj.weight"),
        ];
        for (arch, gguf, hf) in cases {
            assert_eq!(hf_name(arch, gguf).as_deref(), Some(hf), "{gguf}");
        }
        // No suffix is a name only for `ssm_a`; these models have no ffn_norm.
        assert_eq!(hf_name(Arch::Qwen35, "blk.0.attn_q"), None);
        assert_eq!(hf_name(Arch::Qwen35, "blk.0.ffn_norm.weight"), None);
        assert_eq!(hf_name(Arch::Llama, "blk.0.ssm_a"), None);
    }

    #[test]
    fn gemma4_names_map_to_hf() {
        let cases = [
            ("per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight"),
            ("per_layer_model_proj.weight", "model.per_layer_model_projection.weight"),
            ("blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"),
            ("blk.1.post_ffw_norm_1.weight", "model.layers.1.post_feedforward_layernorm_1.weight"),
            ("blk.1.pre_ffw_norm_2.weight", "model.layers.1.pre_feedforward_layernorm_2.weight"),
            ("blk.1.ffn_gate_inp.weight", "model.layers.1.router.proj.weight"),
            ("blk.1.ffn_gate_inp.scale", "model.layers.1.router.scale"),
            ("blk.1.ffn_down_exps.scale", "model.layers.1.router.per_expert_scale"),
            ("blk.1.ffn_down_exps.weight", "model.layers.1.experts.switch_glu.down_proj.weight"),
            ("blk.1.ffn_gate_up_exps.weight", "model.layers.1.experts.switch_glu.gate_up_proj.weight"),
            ("blk.1.inp_gate.weight", "model.layers.1.per_layer_input_gate.weight"),
            ("blk.1.proj.weight", "model.layers.1.per_layer_projection.weight"),
            ("blk.1.post_norm.weight", "model.layers.1.post_per_layer_input_norm.weight"),
            ("blk.1.layer_output_scale.weight", "model.layers.1.layer_scalar"),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_name(Arch::Gemma4, gguf).as_deref(), Some(hf), "{gguf}");
        }
        assert_eq!(hf_name(Arch::Gemma3, "per_layer_token_embd.weight"), None);
        assert_eq!(hf_name(Arch::Gemma4, "blk.1.ffn_gate_exps.weight"), None);
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
