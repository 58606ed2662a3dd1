#!/usr/bin/env python3
"""Reference outputs from mlx-lm (pinned 0.32.2) for the numerical-parity tests.

Usage:
    .venv/bin/python scripts/mlx_lm_ref.py SPEC.json OUT.json
    .venv/bin/python scripts/mlx_lm_ref.py --info

SPEC (every key but "model" optional):
    {
      "model": "<folder loadable by mlx_lm.load>",
      "max_tokens": 8,             # greedy tokens per prompt; EOS does NOT stop generation
      "logits": true,              # also record float32 logits (full vocab) -- see below
      "prompts": [
        {"text": "..."},           # optional "add_special_tokens": bool (default: mlx_lm's rule)
        {"messages": [{"role": "user", "content": "..."}]},  # optional "tools", "add_generation_prompt"
        {"ids": [1, 2, 3]}        # any prompt may also carry its own "max_tokens"
      ],
      "tokenize": ["text1", ...],
      "templates": [{"messages": [...], "add_generation_prompt": true, "tools": null}],
      "kv_bits": 8, "kv_group_size": 64, "quantized_kv_start": 0,  # generate_step's KV quantization
      "tokenizer": false,          # the folder has no tokenizer (tiny models): "ids" prompts only
      "embed": [{"text": "...", "instruction": "..."}, {"ids": [1, 2, 3]}]   # see below
    }

Prompt ids are built the way mlx-lm builds them:
  * text:     tokenizer.encode(text, add_special_tokens=A) with A = stream_generate()'s rule
              `tokenizer.bos_token is None or not text.startswith(tokenizer.bos_token)`
              (the `mlx_lm generate --ignore-chat-template` CLI always uses A=True; same unless
              the text already starts with the BOS string).
  * messages: rendered = tokenizer.apply_chat_template(messages, tokenize=False,
              add_generation_prompt=True), then tokenizer.encode(rendered, add_special_tokens=False)
              exactly as `mlx_lm generate` does; cross-checked against apply_chat_template's own
              tokenization (a mismatch is reported in "warnings").
  * ids:      used as given.
Generation is mlx_lm.generate.generate_step(mx.array(ids), model, max_tokens=N,
sampler=argmax) -- prefill of ids[:-1] into a KV cache, then one step per token.

Per result, with "logits": true:
  last_logits          model(mx.array(ids)[None])[0, -1] -- one full forward, no cache, float32
  gen_last_logits      the logits generate_step itself sampled tokens[0] from (cached prefill of
                       ids[:-1], then ids[-1] alone), float32
  first_decode_logits  the logits generate_step sampled tokens[1] from (tokens[0] fed with the
                       KV cache), float32; null when max_tokens < 2
All are raw logits (generate_step yields log-softmax; these are taken before that).

Per "embed" entry (mlx-bun's embedOne), in "embeddings": {ids, vector}. A text is put in
Qwen3-Embedding's query format when it has an instruction ("Instruct: {i}\nQuery:{text}"),
encoded with add_special_tokens=False, and <|endoftext|> appended (the eos token where the
vocabulary has none); "ids" are used as given. The vector is model.model(ids)[0, -1] -- the
final norm's output at the last position, one forward without a cache -- in float32, divided
by its L2 norm.
"""
import argparse
import importlib.metadata as md
import json
import os
import platform
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _ver(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def info():
    import mlx.core as mx

    return {
        "python": platform.python_version(),
        "mlx_version": _ver("mlx"),
        "mlx_core_version": mx.__version__,
        "mlx_cpu_version": _ver("mlx-cpu"),
        "mlx_lm_version": _ver("mlx-lm"),
        "transformers_version": _ver("transformers"),
        "tokenizers_version": _ver("tokenizers"),
        "default_device": str(mx.default_device()),
    }


class _LogitsTap:
    """Stands in for the model inside generate_step and keeps every forward's output.

    generate_step only calls model(tokens, cache=...) when it is handed a prompt_cache and no
    input_embeddings, so forwarding __call__ is enough. Outputs stay lazy; only the ones we read
    are evaluated (the prefill chunk's full-sequence logits never are).
    """

    def __init__(self, model):
        self.model = model
        self.outputs = []

    def __call__(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.outputs.append(out)
        return out

    def __getattr__(self, name):
        return getattr(self.model, name)


def _f32_list(a):
    import mlx.core as mx

    a = a.astype(mx.float32)
    mx.eval(a)
    return [float(x) for x in a.tolist()]


def _encode_text(tokenizer, text, add_special_tokens=None):
    if add_special_tokens is None:
        bos = tokenizer.bos_token
        add_special_tokens = bos is None or not text.startswith(bos)
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens)), add_special_tokens


def _template_kwargs(entry, default_add_gen=True):
    kw = {k: v for k, v in entry.items() if k not in ("messages", "text", "ids")}
    kw.setdefault("add_generation_prompt", default_add_gen)
    if kw.get("tools") is None:
        kw.pop("tools", None)
    return kw


def build_prompt(tokenizer, p, warnings):
    """-> (ids, extra fields for the result)"""
    if "ids" in p:
        return [int(x) for x in p["ids"]], {"source": "ids"}
    if "text" in p:
        ids, add = _encode_text(tokenizer, p["text"], p.get("add_special_tokens"))
        return ids, {"source": "text", "add_special_tokens": add}
    if "messages" in p:
        kw = _template_kwargs({k: v for k, v in p.items() if k not in ("max_tokens",)})
        rendered = tokenizer.apply_chat_template(p["messages"], tokenize=False, **kw)
        ids = list(tokenizer.encode(rendered, add_special_tokens=False))
        direct = tokenizer.apply_chat_template(p["messages"], tokenize=True, **kw)
        if hasattr(direct, "keys") and "input_ids" in direct:  # a BatchEncoding slipped through
            direct = direct["input_ids"]
        if [int(x) for x in direct] != ids:
            warnings.append(
                f"messages prompt: apply_chat_template(tokenize=True) ids {list(direct)[:16]}... "
                f"differ from encode(rendered, add_special_tokens=False) ids {ids[:16]}...; "
                "using the latter (what `mlx_lm generate` does)"
            )
        return ids, {"source": "messages", "rendered": rendered}
    raise SystemExit(f"prompt needs one of text/messages/ids: {p!r}")


def run_prompt(model, tokenizer, ids, max_tokens, want_logits, kv):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    if not ids:
        raise SystemExit("empty prompt")
    res = {"prompt_ids": ids}

    # 1) one full forward over the whole prompt, no KV cache
    if want_logits:
        t0 = time.perf_counter()
        full = model(mx.array(ids)[None])[0, -1]
        res["last_logits"] = _f32_list(full)
        res["full_forward_s"] = round(time.perf_counter() - t0, 4)
    else:
        res["last_logits"] = None

    # 2) greedy generation through mlx-lm's own generate_step
    tap = _LogitsTap(model) if want_logits else model
    cache = make_prompt_cache(model)
    sampler = lambda x: mx.argmax(x, axis=-1)  # noqa: E731
    tokens, logprobs = [], []
    t0 = time.perf_counter()
    t_first = None
    for tok, lp in generate_step(
        mx.array(ids), tap, max_tokens=max_tokens, sampler=sampler, prompt_cache=cache, **kv
    ):
        if t_first is None:
            t_first = time.perf_counter()
        tokens.append(int(tok))
        logprobs.append(float(lp[tok].astype(mx.float32).item()))
    t_end = time.perf_counter()
    res["tokens"] = tokens
    res["token_logprobs"] = logprobs
    if tokenizer is not None:
        res["text"] = tokenizer.decode(tokens)
        det = tokenizer.detokenizer
        for t in tokens:
            det.add_token(t)
        det.finalize()
        res["stream_text"] = det.text
        eos = set(tokenizer.eos_token_ids)
        res["first_eos_index"] = next((i for i, t in enumerate(tokens) if t in eos), None)
    res["timing"] = {
        "prompt_tokens": len(ids),
        "time_to_first_token_s": round((t_first or t_end) - t0, 4),
        "decode_s_per_token": (
            round((t_end - t_first) / (len(tokens) - 1), 5) if len(tokens) > 1 else None
        ),
    }

    if want_logits:
        # generate_step makes 1 + max_tokens "step" calls (the last one is computed ahead and never
        # yielded) after ceil((len(ids)-1)/prefill_step_size) prefill calls.
        steps = tap.outputs[len(tap.outputs) - (max_tokens + 1):]
        res["gen_last_logits"] = _f32_list(steps[0][0, -1])
        res["first_decode_logits"] = (
            _f32_list(steps[1][0, -1]) if max_tokens >= 2 else None
        )
        la, lb = mx.array(res["last_logits"]), mx.array(res["gen_last_logits"])
        res["max_abs_diff_last_vs_gen"] = float(mx.max(mx.abs(la - lb)).item())
        res["argmax_last_logits"] = int(mx.argmax(la).item())
        tap.outputs.clear()
    return res


def embed(model, tokenizer, e):
    import mlx.core as mx

    if "ids" in e:
        ids = [int(x) for x in e["ids"]]
    else:
        text = e["text"]
        if e.get("instruction"):
            text = f"Instruct: {e['instruction']}\nQuery:{text}"
        vocab = tokenizer.get_vocab()
        end = vocab["<|endoftext|>"] if "<|endoftext|>" in vocab else tokenizer.eos_token_id
        ids = list(tokenizer.encode(text, add_special_tokens=False)) + [end]
    h = model.model(mx.array(ids)[None])[0, -1].astype(mx.float32)
    return {"ids": ids, "vector": _f32_list(h / mx.sqrt(mx.sum(h * h)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("spec", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--info", action="store_true", help="print installed versions as JSON")
    a = ap.parse_args(argv)
    if a.info:
        print(json.dumps(info(), indent=2))
        return 0
    if not a.spec or not a.out:
        ap.error("SPEC.json and OUT.json are required (or --info)")

    spec = json.load(open(a.spec, encoding="utf-8"))
    max_tokens = int(spec.get("max_tokens", 8))
    if max_tokens < 1:
        raise SystemExit("max_tokens must be >= 1")
    want_logits = bool(spec.get("logits", False))

    import mlx.core as mx  # noqa: F401
    import mlx_lm

    t0 = time.perf_counter()
    if spec.get("tokenizer", True):
        model, tokenizer = mlx_lm.load(spec["model"])
    else:
        from pathlib import Path
        from mlx_lm.utils import load_model
        model, tokenizer = load_model(Path(spec["model"]))[0], None
    load_s = time.perf_counter() - t0
    kv = {k: spec[k] for k in ("kv_bits", "kv_group_size", "quantized_kv_start") if k in spec}

    warnings = []
    out = info()
    out.update({
        "model": spec["model"],
        "max_tokens": max_tokens,
        "load_s": round(load_s, 3),
        "kv": kv,
        "warnings": warnings,
        "results": [],
        "tokenize": [],
        "templates": [],
    })
    if tokenizer is not None:
        out.update({
            "eos_token_ids": sorted(int(x) for x in tokenizer.eos_token_ids),
            "bos_token": tokenizer.bos_token,
            "bos_token_id": tokenizer.bos_token_id,
            "has_chat_template": bool(tokenizer.has_chat_template),
            "vocab_size_tokenizer": len(tokenizer),
        })

    for p in spec.get("prompts", []):
        ids, extra = build_prompt(tokenizer, p, warnings)
        n = int(p.get("max_tokens", max_tokens))
        r = run_prompt(model, tokenizer, ids, n, want_logits, kv)
        r.update(extra)
        out["results"].append(r)
        print(f"[mlx_lm_ref] {extra['source']}: {len(ids)} prompt ids -> {r['tokens']} "
              f"{r.get('text')!r} ({r['timing']})", file=sys.stderr)

    for text in spec.get("tokenize", []):
        with_sp = list(tokenizer.encode(text, add_special_tokens=True))
        no_sp = list(tokenizer.encode(text, add_special_tokens=False))
        out["tokenize"].append({
            "text": text,
            "ids_with_special": with_sp,
            "ids_no_special": no_sp,
            "decoded": tokenizer.decode(no_sp),
            "decoded_with_special": tokenizer.decode(with_sp),
        })

    for t in spec.get("templates", []):
        kw = _template_kwargs(t)
        rendered = tokenizer.apply_chat_template(t["messages"], tokenize=False, **kw)
        out["templates"].append({
            "rendered": rendered,
            "ids": list(tokenizer.encode(rendered, add_special_tokens=False)),
        })

    out["embeddings"] = [embed(model, tokenizer, e) for e in spec.get("embed", [])]

    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    for w in warnings:
        print(f"[mlx_lm_ref] WARNING: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
