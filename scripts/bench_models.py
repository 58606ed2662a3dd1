#!/usr/bin/env python3
"""Random-weight models of benchmark size (tiny but not toys) for the architectures no real
checkpoint here carries, made with mlx-lm's own classes and given SmolLM2's tokenizer so both
engines load them as they would a downloaded folder:

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        .venv/bin/python scripts/bench_models.py OUT_DIR [SMOLLM2_FOLDER [NAME,NAME...]]

OUT_DIR/<name> for each entry of MODELS (f32 safetensors, config.json, tokenizer files). f32:
MLX's CPU backend multiplies gathered experts (`gather_mm`) in float32 only; a bf16 MoE fails
there, in mlx-lm as here.
Speed does not depend on the weights' values, only on the shapes: these are for
scripts/bench.py and scripts/bench-batch.js, never for parity (scripts/tiny_models.py is).
"""
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

VOCAB = 49152  # SmolLM2's tokenizer

MODELS = {
    # 8 layers, 32 experts of width 256, top 4 (Qwen3-30B-A3B routes 8 of 128): ~140M
    # parameters of which ~40M are read per token.
    "qwen3_moe": {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 512,
        "num_hidden_layers": 8, "intermediate_size": 1536, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "max_position_embeddings": 32768,
        "num_experts": 32, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "moe_intermediate_size": 256, "norm_topk_prob": True,
        "torch_dtype": "float32", "eos_token_id": 2, "bos_token_id": 1,
    },
    # Gemma 4 as E2B is, scaled down: 8 layers (every 4th global, 128-wide heads, the others
    # sliding over 512 with 64-wide ones, one KV head), the last 3 sharing keys and values,
    # per-layer inputs of 64 per layer: ~100M parameters.
    "gemma4_text": {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 512,
        "num_hidden_layers": 8, "intermediate_size": 1536, "num_attention_heads": 8,
        "num_key_value_heads": 1, "head_dim": 64, "global_head_dim": 128, "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 64,
        "num_kv_shared_layers": 3, "sliding_window": 512, "sliding_window_pattern": 4,
        "max_position_embeddings": 32768, "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True, "torch_dtype": "float32", "eos_token_id": 2, "bos_token_id": 1,
    },
    # Qwen3.5 as its small dense models are, scaled down: 8 layers, every 4th full attention
    # (8 heads of 64, 2 KV heads, a quarter of each head rotated, output gates), the others gated
    # DeltaNet (4 key heads and 8 value heads of 64, kernel 4): ~90M parameters.
    "qwen3_5": {
        "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "hidden_size": 512,
        "num_hidden_layers": 8, "intermediate_size": 1536, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 64, "full_attention_interval": 4,
        "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB, "max_position_embeddings": 32768, "tie_word_embeddings": True,
        "rope_parameters": {"type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "torch_dtype": "float32", "eos_token_id": 2, "bos_token_id": 1,
    },
    # Gemma 4 as 26B-A4B is, scaled down: 6 layers (every 3rd global, whose values are its keys,
    # one global KV head), 32 GeGLU experts of width 256, top 4, beside each dense MLP.
    "gemma4_text_moe": {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 512,
        "num_hidden_layers": 6, "intermediate_size": 1024, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 64, "global_head_dim": 128, "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
        "sliding_window": 512, "sliding_window_pattern": 3, "attention_k_eq_v": True,
        "num_global_key_value_heads": 1, "enable_moe_block": True, "num_experts": 32,
        "top_k_experts": 4, "moe_intermediate_size": 256, "max_position_embeddings": 32768,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "torch_dtype": "float32",
        "eos_token_id": 2, "bos_token_id": 1,
    },
    # Qwen3-Next, scaled down: the Qwen3.5 shape above with 32 experts of width 256 (top 4) and a
    # shared expert in every layer.
    "qwen3_next": {
        "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 512,
        "num_hidden_layers": 8, "intermediate_size": 1536, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 64, "full_attention_interval": 4,
        "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "num_experts": 32,
        "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256, "norm_topk_prob": True,
        "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB, "max_position_embeddings": 32768, "tie_word_embeddings": True,
        "torch_dtype": "float32", "eos_token_id": 2, "bos_token_id": 1,
    },
}

# The generic dense families, one shape for all: 8 layers, hidden 512, 8 heads of 64 (4 KV
# heads), MLP 1536: ~85M parameters with SmolLM2's vocabulary. Each family's own settings beside.
DENSE = {
    "hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1536, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
    "max_position_embeddings": 32768, "torch_dtype": "float32", "eos_token_id": 2, "bos_token_id": 1,
}
for name, extra in {
    "gemma": {"architectures": ["GemmaForCausalLM"], "rope_theta": 10000.0, "hidden_act": "gelu"},
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "query_pre_attn_scalar": 64, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "rope_theta": 10000.0, "hidden_activation": "gelu_pytorch_tanh"},
    "smollm3": {"architectures": ["SmolLM3ForCausalLM"], "rope_theta": 5000000.0, "no_rope_layer_interval": 4,
                "tie_word_embeddings": True},
    "olmo2": {"architectures": ["Olmo2ForCausalLM"], "rope_theta": 500000.0, "tie_word_embeddings": False},
    "glm4": {"architectures": ["Glm4ForCausalLM"], "partial_rotary_factor": 0.5, "attention_bias": True,
             "rope_theta": 10000.0, "tie_word_embeddings": False},
    "granite": {"architectures": ["GraniteForCausalLM"], "attention_multiplier": 0.015625, "embedding_multiplier": 12.0,
                "residual_multiplier": 0.22, "logits_scaling": 8.0, "attention_bias": False, "mlp_bias": False,
                "rope_theta": 10000.0, "tie_word_embeddings": True},
    "starcoder2": {"architectures": ["Starcoder2ForCausalLM"], "norm_epsilon": 1e-5, "rope_theta": 100000.0,
                   "tie_word_embeddings": True},
    # Untied: mlx-lm 0.32.2 cannot load a tied MiniCPM.
    "minicpm": {"architectures": ["MiniCPMForCausalLM"], "dim_model_base": 256, "scale_depth": 1.4, "scale_emb": 12.0,
                "rope_theta": 10000.0, "tie_word_embeddings": False},
}.items():
    MODELS[name] = {**DENSE, "model_type": name, **extra}


def main(argv):
    if len(argv) not in (2, 3, 4):
        raise SystemExit(__doc__)
    out = Path(argv[1])
    tokenizer = Path(argv[2]) if len(argv) == 3 else Path(__file__).resolve().parent.parent / "fixtures" / "smollm2-f32"
    only = set(argv[3].split(",")) if len(argv) == 4 else None
    for name, cfg in MODELS.items():
        if only and name not in only:
            continue
        path = out / name
        path.mkdir(parents=True, exist_ok=True)
        mx.random.seed(0)
        model_class, args_class = _get_classes(cfg)
        model = model_class(args_class.from_dict(cfg))
        weights = dict(tree_flatten(model.parameters()))
        mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (tokenizer / f).exists():
                shutil.copy(tokenizer / f, path / f)
        count = sum(v.size for v in weights.values())
        print(f"{path}: {count / 1e6:.0f}M parameters", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
