#!/usr/bin/env python3
"""Tiny random-weight models of every supported architecture, and mlx-lm's outputs on them.

Usage (mlx-lm on the same BLAS as the addon):
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        .venv/bin/python scripts/tiny_models.py OUT_DIR

For each architecture below, the model is built with mlx-lm's own class
(mlx_lm.models.<arch>.Model(ModelArgs.from_dict(cfg))), re-initialised from a fixed seed, and saved
as an HF-style folder OUT_DIR/<name> (config.json + model.safetensors). The folder is then loaded
back with mlx_lm.utils.load_model, quantized to MLX affine 4-bit (group 32) with
mlx_lm.utils.quantize_model and written with save_model/save_config into OUT_DIR/<name>-q4 --
exactly what `mlx_lm.convert(quantize=True, q_bits=4, q_group_size=32)` does, minus the tokenizer
these models do not have. Both folders are loaded back with load_model and their references come
from those reloaded models.

OUT_DIR/ref-tiny.json:
    {"mlx_version", "mlx_lm_version", "max_tokens": 64, "models": [
      {"name", "model_type", "path" (relative to OUT_DIR), "quantized", "seed", "min_gap",
       "note" (what had to be worked around, or null),
       "prompts": [{"ids", "tokens", "tokens_chunk8" (long prompt only),
                    "last_logits" (f32 folders only, else null),
                    "experts_reached" (f32 folders of mixture-of-experts models)}]}]}
  tokens        mlx_lm.generate.generate_step(mx.array(ids), model, max_tokens=64,
                sampler=argmax) -- prefill of ids[:-1] with the default prefill_step_size (2048);
                EOS never stops it
  tokens_chunk8 the same with prefill_step_size=8
  last_logits   model(mx.array(ids)[None])[0, -1], float32
  min_gap       smallest top-1 minus top-2 log-probability over every generated step of every run
                of that folder (seeds are chosen so it exceeds MIN_GAP; float noise cannot flip
                argmax)
"""
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import importlib.metadata as md  # noqa: E402

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten, tree_map_with_path  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import _get_classes, load_model, quantize_model, save_config, save_model  # noqa: E402

MAX_TOKENS = 64
MIN_GAP = 1e-3
MIN_DISTINCT = 8  # distinct tokens per 64-token run, so greedy decoding is not degenerate
SEED_TRIES = 40
WINDOW = 16
W_SCALE = float(os.environ.get("TINY_W_SCALE", "3.0"))

BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "eos_token_id": 0,
    "bos_token_id": 1,
}

SU_ROPE_DIMS = 8  # head_dim 16 * partial_rotary_factor 0.5

# name -> (seed base, config). Tied or not is set per model to cover both output projections.
ARCHS = [
    ("llama", 100, {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 2048,
    }),
    ("llama_rope_llama3", 200, {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 500000.0, "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }),
    # Every layer sliding: mlx-lm 0.32.2's llama.py cannot build this (see build_model).
    ("mistral", 300, {
        "model_type": "mistral", "architectures": ["MistralForCausalLM"], "num_hidden_layers": 3,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 32768,
        "sliding_window": WINDOW, "layer_types": ["sliding_attention"] * 3,
    }),
    ("mistral_mixed", 400, {
        "model_type": "mistral", "architectures": ["MistralForCausalLM"], "num_hidden_layers": 3,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "max_position_embeddings": 32768,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    }),
    ("qwen2", 500, {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
    }),
    ("qwen3", 600, {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 40960,
        "head_dim": 32, "rms_norm_eps": 1e-6,
    }),
    ("gemma3_text", 700, {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 4,
        "head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": WINDOW,
        "sliding_window_pattern": 2, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_scaling": None,
        "hidden_activation": "gelu_pytorch_tanh",
    }),
    ("phi3", 800, {
        "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096,
    }),
    ("phi3_su", 900, {
        "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "partial_rotary_factor": 0.5,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 1024,
        "rope_scaling": {"type": "su",
                         "long_factor": [1.0, 1.25, 2.5, 4.0][: SU_ROPE_DIMS // 2],
                         "short_factor": [1.0, 1.05, 1.1, 1.2][: SU_ROPE_DIMS // 2]},
    }),
    ("gemma", 1000, {
        "model_type": "gemma", "architectures": ["GemmaForCausalLM"], "num_hidden_layers": 2,
        "head_dim": 16, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192,
        "hidden_act": "gelu",
    }),
    # Caps small enough that tiny random weights reach them (Gemma 2's defaults are 50 and 30).
    ("gemma2", 1100, {
        "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 3,
        "head_dim": 32, "query_pre_attn_scalar": 32, "attn_logit_softcapping": 4.0,
        "final_logit_softcapping": 8.0, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
    }),
    # NoPE in layers 1 and 3, sliding in layers 0 and 3: every rope/window combination.
    ("smollm3", 1200, {
        "model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 4,
        "rope_theta": 5000000.0, "tie_word_embeddings": False, "max_position_embeddings": 65536,
        "no_rope_layer_interval": 2, "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"],
    }),
    # SmolLM3 as its GGUF files describe it (llama.cpp keeps no windows and hardcodes NoPE in
    # every fourth layer): the GGUF test's reference.
    ("smollm3_full", 2700, {
        "model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 4,
        "rope_theta": 5000000.0, "tie_word_embeddings": False, "max_position_embeddings": 65536,
        "no_rope_layer_interval": 4,
    }),
    ("olmo2", 1300, {
        "model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 500000.0, "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
    }),
    ("glm4", 1400, {
        "model_type": "glm4", "architectures": ["Glm4ForCausalLM"], "num_hidden_layers": 2,
        "head_dim": 16, "partial_rotary_factor": 0.5, "attention_bias": True, "rope_theta": 10000.0,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
    }),
    ("granite", 1500, {
        "model_type": "granite", "architectures": ["GraniteForCausalLM"], "num_hidden_layers": 2,
        "attention_multiplier": 0.2, "embedding_multiplier": 0.5, "residual_multiplier": 1.5,
        "logits_scaling": 2.0, "attention_bias": True, "mlp_bias": False, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": True,
    }),
    ("starcoder2", 1600, {
        "model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"], "num_hidden_layers": 2,
        "norm_epsilon": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    }),
    # 6 experts, top 2, in layers 1 and 2 (decoder_sparse_step 1, layer 0 dense by
    # mlp_only_layers): dense and expert layers, renormalised top-k scores, untied output.
    ("qwen3_moe", 1800, {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 3,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 40960,
        "head_dim": 32, "rms_norm_eps": 1e-6, "num_experts": 6, "num_experts_per_tok": 2,
        "decoder_sparse_step": 1, "mlp_only_layers": [0], "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    }),
    # Gemma 4 as its small models are (E2B/E4B): per-layer input embeddings, the last 2 of 6
    # layers reusing the keys and values of the last earlier layer of their kind, their MLPs twice
    # as wide; sliding layers with head_dim 16 and full ones with 32, rotated over a quarter of
    # their features (proportional RoPE); logits soft-capped at a cap tiny weights reach.
    ("gemma4_text", 1900, {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "num_hidden_layers": 6,
        "head_dim": 16, "global_head_dim": 32, "sliding_window": WINDOW, "sliding_window_pattern": 3,
        "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "hidden_size_per_layer_input": 32,
        "vocab_size_per_layer_input": 256, "final_logit_softcapping": 8.0, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "tie_word_embeddings": True, "enable_moe_block": False,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    }),
    # Gemma 4 as its 26B-A4B is: a mixture of experts beside each dense MLP, full layers whose
    # values are their keys (one global KV head), explicit layer types, an untied output.
    ("gemma4_text_moe", 2000, {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "num_hidden_layers": 3,
        "head_dim": 16, "global_head_dim": 32, "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "attention_k_eq_v": True,
        "num_global_key_value_heads": 1, "enable_moe_block": True, "num_experts": 6,
        "top_k_experts": 2, "moe_intermediate_size": 32, "final_logit_softcapping": 8.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    }),
    # Gemma 4 with full-attention layers only, so rows of a batch stack into one cache and the
    # shared layers borrow the stacked keys and values.
    ("gemma4_text_full", 2200, {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "num_hidden_layers": 4,
        "head_dim": 16, "global_head_dim": 32, "layer_types": ["full_attention"] * 4,
        "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 0, "final_logit_softcapping": 8.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": True,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.5, "rope_theta": 1000000.0, "rope_type": "proportional"},
        },
    }),
    # Gemma 4 as published (model_type gemma4: towers for images and audio beside the text model;
    # mlx-lm runs the text model from text_config, whose vocabulary is the top level's): every
    # text-model branch at once (per-layer inputs, shared KV, experts, keys as values).
    ("gemma4", 2100, {
        "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "vocab_size": 256,
        "text_config": {
            **BASE, "model_type": "gemma4_text", "num_hidden_layers": 5, "head_dim": 16,
            "global_head_dim": 32, "sliding_window": WINDOW, "sliding_window_pattern": 2,
            "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "hidden_size_per_layer_input": 32,
            "vocab_size_per_layer_input": 256, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
            "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
            "final_logit_softcapping": 8.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
        },
    }),
    # Every layer routed, as llama.cpp's qwen3moe GGUF layout has it (no dense layers).
    ("qwen3_moe_sparse", 2300, {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 2,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "max_position_embeddings": 40960,
        "head_dim": 32, "rms_norm_eps": 1e-6, "num_experts": 4, "num_experts_per_tok": 2,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    }),
    # Qwen3.5 (dense): gated DeltaNet layers (value heads sharing key heads two to one) with a
    # full-attention layer every second one, RoPE over a quarter of each head, output gates.
    ("qwen3_5", 2400, {
        "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "num_hidden_layers": 4,
        "head_dim": 16, "full_attention_interval": 2, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "rope_parameters": {"type": "default", "mrope_section": [2, 1, 1], "rope_theta": 100000.0, "partial_rotary_factor": 0.25},
    }),
    # Qwen3.5-MoE as published: the text model in text_config; experts and a gated shared
    # expert in every layer, tied output.
    ("qwen3_5_moe", 2500, {
        "model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "text_config": {
            **BASE, "model_type": "qwen3_5_moe_text", "num_hidden_layers": 3, "head_dim": 16,
            "full_attention_interval": 3, "linear_num_value_heads": 2, "linear_num_key_heads": 2,
            "linear_key_head_dim": 16, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 3,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.5},
        },
    }),
    # Qwen3-Next: projections fused per key head, experts in every second layer (one listed
    # dense), un-renormalised top-k.
    ("qwen3_next", 2600, {
        "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
        "head_dim": 16, "full_attention_interval": 4, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [2],
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "norm_topk_prob": False,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "tie_word_embeddings": False,
    }),
    # MiniCPM with LongRoPE (MiniCPM4, MiniCPM-2B-128k): mlx-lm's rope_utils reads the trained
    # length from rope_scaling and scales by it (here 4096 over 1024).
    ("minicpm_longrope", 2900, {
        "model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"], "num_hidden_layers": 2,
        "dim_model_base": 16, "scale_depth": 1.4, "scale_emb": 12.0, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 1024,
                         "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
                         "short_factor": [1.0, 1.1, 1.2, 1.4, 1.7, 2.0, 2.5, 3.0]},
    }),
    # Qwen3-Next as released (and as llama.cpp's qwen3next describes every file): experts in every
    # layer, renormalised top-k; full attention every second layer.
    ("qwen3_next_released", 2800, {
        "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
        "head_dim": 16, "full_attention_interval": 2, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "norm_topk_prob": True,
        "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "tie_word_embeddings": False,
    }),
    # Untied: mlx-lm 0.32.2 cannot load a tied MiniCPM (its sanitize adds an lm_head the tied
    # model does not have).
    ("minicpm", 1700, {
        "model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"], "num_hidden_layers": 2,
        "dim_model_base": 16, "scale_depth": 1.4, "scale_emb": 12.0, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False,
    }),
]

NOTES = {
    "qwen3_moe": "mlx-lm 0.32.2's QuantizedSwitchLinear passes global_scale=None to mx.gather_qmm, "
    "which mlx 0.32.2 does not take; the 4-bit reference runs its call without that argument "
    "(quantized_experts_fix)",
    "mistral": "mlx-lm 0.32.2 llama.py raises ValueError when no layer is full_attention "
    "(LlamaModel.__init__: layer_types.index('full_attention')); the reference model is built "
    "with the last layer full and then every layer switched to sliding (use_sliding=True, "
    "swa_idx=0), which is what llama.py would do if it allowed it; make_cache then gives every "
    "layer a RotatingKVCache(16)",
}


def quantized_experts_fix():
    """mlx-lm 0.32.2's QuantizedSwitchLinear passes `global_scale=None` to mx.gather_qmm, which
    mlx 0.32.2 (the version mlx-c 0.7.0 pins) does not take: every quantized mixture-of-experts
    model fails there. With no global scale (affine mode) the call is the same without it."""
    from mlx_lm.models import switch_layers

    if "global_scale" in (mx.gather_qmm.__doc__ or ""):
        return

    def call(self, x, indices, sorted_indices=False):
        assert self.global_scale is None
        x = mx.gather_qmm(x, self["weight"], self["scales"], self.get("biases"), rhs_indices=indices,
                          transpose=True, group_size=self.group_size, bits=self.bits, mode=self.mode,
                          sorted_indices=sorted_indices)
        if "bias" in self:
            x = x + mx.expand_dims(self["bias"][indices], -2)
        return x

    switch_layers.QuantizedSwitchLinear.__call__ = call


def prompts():
    rng = np.random.default_rng(12345)
    short = [int(x) for x in rng.integers(2, 256, size=6)]
    long = [int(x) for x in rng.integers(2, 256, size=40)]
    return short, long


def all_sliding_fix(model):
    """Turns every layer of a llama.py model into a sliding-window layer (see NOTES)."""
    inner = model.model
    for layer in inner.layers:
        layer.use_sliding = True
    inner.layer_types = ["sliding_attention"] * len(inner.layers)
    inner.swa_idx = 0
    return model


def build_model(name, cfg):
    cfg_build = dict(cfg)
    if name == "mistral":
        cfg_build["layer_types"] = cfg["layer_types"][:-1] + ["full_attention"]
    model_class, args_class = _get_classes(cfg_build)
    model = model_class(args_class.from_dict(cfg_build))
    if name == "mistral":
        all_sliding_fix(model)
    return model


def reinit(model, model_type):
    """Embedding std 0.3 (0.1 for Gemma; non-degenerate logits); norm weights randomised around their identity
    (1 for RMSNorm, 0 for Gemma 1-3's (1 + w) RMSNorm) so a wrong norm convention shows, LayerNorm
    biases around 0; everything
    else is mlx-lm's own init (uniform +-1/sqrt(fan_in)) times W_SCALE, so the blocks move the
    residual stream away from the input embedding (else tied models just echo the last token)."""
    gemma = model_type.startswith("gemma")
    # Gemma 4's norms are plain RMSNorms (weight = scale), unlike Gemma 1-3's (1 + w).
    identity = 1.0 if model_type in ("gemma4", "gemma4_text") or not gemma else 0.0

    def f(path, v):
        if path.endswith("embed_tokens.weight"):
            # Gemma scales embeddings by sqrt(hidden) = 8: a smaller std keeps the tied model
            # from echoing its last token forever.
            return (0.1 if gemma else 0.3) * mx.random.normal(v.shape)
        if "norm" in path.split(".")[-2] and path.endswith(".weight"):
            centre = identity
            if gemma and ".post_" in path:
                # Gemma's post-norms set the size of each block's residual update; x3 so the
                # blocks are not drowned by the sqrt(hidden)-scaled embedding.
                centre = identity + 2.0
            return centre + 0.2 * mx.random.normal(v.shape)
        if "norm" in path.split(".")[-2] and path.endswith(".bias"):
            return 0.2 * mx.random.normal(v.shape)
        if path.endswith(("A_log", "dt_bias")):
            # The DeltaNet's decay rates as mlx-lm initialises them: scaled, every state would
            # forget each token at once.
            return v
        if path.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
            # Gemma 4's multipliers start at 1: randomised around it like the norms.
            return 1.0 + 0.2 * mx.random.normal(v.shape)
        return W_SCALE * v

    model.update(tree_map_with_path(f, model.parameters()))
    mx.eval(model.parameters())


def write_folder(path, model, cfg):
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    if cfg.get("tie_word_embeddings", cfg["model_type"] == "gemma3_text") and "lm_head.weight" in weights:
        raise SystemExit(f"{path}: tied model would save an lm_head")
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    with open(path / "config.json", "w") as f:
        json.dump(cfg, f, indent=2)


def load_back(path, name):
    if name == "mistral":
        cfg = json.load(open(path / "config.json"))
        override = {"layer_types": cfg["layer_types"][:-1] + ["full_attention"]}
        model, config = load_model(path, model_config=override)
        all_sliding_fix(model)
        config["layer_types"] = cfg["layer_types"]
        return model, config
    return load_model(path)


def greedy(model, ids, prefill_step_size=2048):
    cache = make_prompt_cache(model)
    tokens, gaps = [], []
    for tok, lp in generate_step(
        mx.array(ids), model, max_tokens=MAX_TOKENS, sampler=lambda x: mx.argmax(x, axis=-1),
        prompt_cache=cache, prefill_step_size=prefill_step_size,
    ):
        lp = np.array(lp.astype(mx.float32))
        top2 = np.partition(lp, -2)[-2:]
        tokens.append(int(tok))
        gaps.append(float(top2[1] - top2[0]))
    assert len(tokens) == MAX_TOKENS
    return tokens, min(gaps)


def experts_reached(model, ids):
    """Per mixture-of-experts layer, the experts mlx-lm's router picks for any token of `ids` in
    one forward (None for a dense model): the block's own routing, recomputed beside it."""
    seen = []
    reached = lambda inds: seen.append(sorted(set(int(i) for i in np.array(inds).flatten())))  # noqa: E731
    blocks = [layer.mlp for layer in model.layers if hasattr(getattr(layer, "mlp", None), "switch_mlp")]
    routers = [layer.router for layer in model.layers if hasattr(layer, "router")]
    if blocks:
        cls = type(blocks[0])
        original = cls.__call__

        def spy(self, x):
            gates = mx.softmax(self.gate(x), axis=-1, precise=True)
            reached(mx.argpartition(gates, kth=-self.top_k, axis=-1)[..., -self.top_k:])
            return original(self, x)
    elif routers:  # Gemma 4: the router returns the indices it picks
        cls = type(routers[0])
        original = cls.__call__

        def spy(self, x):
            inds, weights = original(self, x)
            reached(inds)
            return inds, weights
    else:
        return None

    cls.__call__ = spy
    try:
        mx.eval(model(mx.array(ids)[None]))
    finally:
        cls.__call__ = original
    return seen


def references(model, with_logits):
    short, long = prompts()
    out, gap, distinct = [], float("inf"), MAX_TOKENS
    for ids in (short, long):
        r = {"ids": ids}
        r["tokens"], g = greedy(model, ids)
        gap, distinct = min(gap, g), min(distinct, len(set(r["tokens"])))
        if ids is long:
            r["tokens_chunk8"], g = greedy(model, ids, prefill_step_size=8)
            gap = min(gap, g)
        if with_logits:
            logits = model(mx.array(ids)[None])[0, -1].astype(mx.float32)
            r["last_logits"] = [float(x) for x in np.array(logits)]
            r["experts_reached"] = experts_reached(model, ids)
        else:
            r["last_logits"] = None
        out.append(r)
    return out, gap, distinct


def make_arch(out_dir, name, seed_base, cfg):
    cfg = {**BASE, **cfg}
    for seed in range(seed_base, seed_base + SEED_TRIES):
        mx.random.seed(seed)
        model = build_model(name, cfg)
        if cfg["model_type"] == "gemma3_text" and "lm_head" in model:
            # Gemma ties exactly when lm_head.weight is absent (Model.sanitize).
            model.tie_word_embeddings = True
            model.pop("lm_head")
        reinit(model, cfg["model_type"])

        f32_dir, q4_dir = out_dir / name, out_dir / f"{name}-q4"
        write_folder(f32_dir, model, cfg)
        model, config = load_back(f32_dir, name)
        refs, gap, distinct = references(model, True)
        if gap <= MIN_GAP or distinct < MIN_DISTINCT:
            print(f"  {name} seed {seed}: f32 min gap {gap:.2e}, {distinct} distinct -- next seed", file=sys.stderr)
            continue

        qmodel, qconfig = quantize_model(model, config, 32, 4)
        if q4_dir.exists():
            shutil.rmtree(q4_dir)
        save_model(q4_dir, qmodel)
        save_config(qconfig, q4_dir / "config.json")
        qmodel, _ = load_back(q4_dir, name)
        qrefs, qgap, qdistinct = references(qmodel, False)
        if qgap <= MIN_GAP or qdistinct < MIN_DISTINCT:
            print(f"  {name} seed {seed}: q4 min gap {qgap:.2e}, {qdistinct} distinct -- next seed", file=sys.stderr)
            continue

        common = {"model_type": cfg["model_type"], "seed": seed, "note": NOTES.get(name)}
        print(f"  {name} seed {seed}: min gap f32 {gap:.3g} q4 {qgap:.3g}; tokens {refs[1]['tokens'][:12]}...",
              file=sys.stderr)
        return [
            {"name": name, "path": name, "quantized": False, "min_gap": gap, **common, "prompts": refs},
            {"name": f"{name}-q4", "path": f"{name}-q4", "quantized": True, "min_gap": qgap, **common,
             "prompts": qrefs},
        ]
    raise SystemExit(f"{name}: no seed in [{seed_base}, {seed_base + SEED_TRIES}) meets the gap/variety bar")


def main(argv):
    if len(argv) != 2:
        raise SystemExit(__doc__)
    out_dir = Path(argv[1]).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if "libopenblas" not in os.environ.get("LD_PRELOAD", ""):
        print("[tiny_models] WARNING: LD_PRELOAD has no OpenBLAS; mlx-lm may use another BLAS than the addon",
              file=sys.stderr)
    quantized_experts_fix()
    t0 = time.perf_counter()
    models = []
    only = set(os.environ.get("TINY_ONLY", "").split(",")) - {""}
    for name, seed_base, cfg in ARCHS:
        if only and name not in only:
            continue
        models.extend(make_arch(out_dir, name, seed_base, cfg))
    ref = {
        "mlx_version": md.version("mlx"),
        "mlx_lm_version": md.version("mlx-lm"),
        "max_tokens": MAX_TOKENS,
        "models": models,
    }
    # TINY_ONLY=name,... (for debugging) writes ref-tiny.partial.json, never a partial ref-tiny.json.
    final = out_dir / ("ref-tiny.partial.json" if only else "ref-tiny.json")
    tmp = final.with_suffix(".part")
    with open(tmp, "w") as f:
        json.dump(ref, f)
    tmp.replace(final)
    print(f"[tiny_models] {len(models)} models in {out_dir} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
