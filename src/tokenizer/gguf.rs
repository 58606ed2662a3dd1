//! Rebuilds a HF `tokenizers` tokenizer from the vocabulary llama.cpp embeds in GGUF files.
//!
//! The result is the tokenizer.json that transformers' GGUF conversion would produce, so ids
//! match both llama.cpp and the original HF tokenizer. It is assembled as JSON and deserialized,
//! which keeps every component in the one format `tokenizers` documents and tests.
use std::collections::HashMap;

use serde_json::{json, Map, Value as Json};

use crate::error::{Error, Result};
use crate::model::gguf::Gguf;

/// llama.cpp token types (`llama_token_type`).
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Split regexes of the pre-tokenizers llama.cpp names in `tokenizer.ggml.pre`, as written in
/// the original models' tokenizer.json files.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub fn tokenizer_from_gguf(g: &Gguf) -> Result<tokenizers::Tokenizer> {
    serde_json::from_value(tokenizer_json(g)?)
        .map_err(|e| Error::Tokenizer(format!("{}: building the tokenizer: {e}", g.path().display())))
}

fn tokenizer_json(g: &Gguf) -> Result<Json> {
    let err = |msg: String| Error::Tokenizer(format!("{}: {msg}", g.path().display()));
    let model = g.get_str("tokenizer.ggml.model").ok_or_else(|| err("no tokenizer.ggml.model".into()))?;
    let tokens = g
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or_else(|| err("no tokenizer.ggml.tokens string array".into()))?;
    let types = match g.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(_) => g
            .get_i64_array("tokenizer.ggml.token_type")
            .filter(|t| t.len() == tokens.len())
            .ok_or_else(|| err("tokenizer.ggml.token_type is not one integer per token".into()))?,
    };

    let (mut tj, add_bos_default) = match model {
        "gpt2" => (byte_level_bpe(g, &tokens, &types).map_err(err)?, false),
        "llama" => (sentencepiece_bpe(g, &tokens, &types).map_err(err)?, true),
        other => return Err(err(format!("tokenizer model '{other}' is not supported (supported: gpt2, llama)"))),
    };
    if g.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(add_bos_default) {
        let bos = g
            .get_u64("tokenizer.ggml.bos_token_id")
            .and_then(|id| Some((id, *tokens.get(usize::try_from(id).ok()?)?)))
            .ok_or_else(|| err("add_bos_token is set but tokenizer.ggml.bos_token_id is missing or out of range".into()))?;
        tj["post_processor"] = bos_post_processor(bos.1, bos.0);
    }
    Ok(tj)
}

/// GPT-2 style byte-level BPE (SmolLM, Llama 3, Qwen2, ...).
fn byte_level_bpe(g: &Gguf, tokens: &[&str], types: &[i64]) -> std::result::Result<Json, String> {
    let merges = g.get_str_array("tokenizer.ggml.merges").ok_or("no tokenizer.ggml.merges string array")?;
    let merges = merges
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| json!([a, b])).ok_or_else(|| format!("merge '{m}' has no space")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});

    let pre = g.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let (pretokenizers, normalizer, ignore_merges) = match pre {
        "default" | "gpt-2" => (vec![byte_level(true)], Json::Null, false),
        // llama.cpp's SMOLLM pre-type: every digit on its own, then the GPT-2 regex.
        "smollm" => (vec![json!({"type": "Digits", "individual_digits": true}), byte_level(true)], Json::Null, false),
        // Llama 3's tokenizer.json sets ignore_merges: whole words in the vocab win outright.
        "llama-bpe" | "smaug-bpe" | "dbrx" => (vec![split(LLAMA3_SPLIT), byte_level(false)], Json::Null, true),
        "qwen2" | "deepseek-r1-qwen" => (vec![split(QWEN2_SPLIT), byte_level(false)], json!({"type": "NFC"}), false),
        // Guessing would silently produce wrong ids, which is worse than refusing.
        other => return Err(format!("pre-tokenizer '{other}' is not supported (supported: default, gpt-2, smollm, llama-bpe, qwen2)")),
    };
    // Later duplicates win, as in a Python dict built from the token list.
    let vocab: Map<String, Json> = tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(tokens, types, &[CONTROL]),
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretokenizers},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges
        }
    }))
}

/// SentencePiece-style BPE with byte fallback (Gemma, Llama 2, Mistral): spaces are U+2581 and
/// characters missing from the vocabulary become <0xNN> byte tokens.
fn sentencepiece_bpe(g: &Gguf, tokens: &[&str], types: &[i64]) -> std::result::Result<Json, String> {
    // llama.cpp keeps multi-space tokens with real spaces; the HF vocabulary spells them with
    // U+2581 like every other space, which is what the normalizer produces.
    let tokens: Vec<String> = tokens
        .iter()
        .map(|t| if t.contains(' ') && t.trim().is_empty() { "\u{2581}".repeat(t.chars().count()) } else { t.to_string() })
        .collect();
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        ids.entry(t.as_str()).or_insert(i);
    }
    let merges: Vec<Json> = merges_from_vocab(&tokens, &ids).into_iter().map(|(a, b)| json!([a, b])).collect();
    let vocab: Map<String, Json> = ids.iter().map(|(t, &i)| (t.to_string(), json!(i))).collect();
    let unk = g.get_u64("tokenizer.ggml.unknown_token_id").and_then(|i| tokens.get(usize::try_from(i).ok()?));

    // Llama 2 style models (the llama.cpp default) prefix the text with a space; Gemma does not.
    let space = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    let normalizer = if g.get_bool("tokenizer.ggml.add_space_prefix").unwrap_or(true) {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, space]})
    } else {
        space
    };
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens(&token_refs, types, &[CONTROL, UNKNOWN]),
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    }))
}

/// SentencePiece BPE has no merge list, only scores, and Gemma's scores do not follow merge
/// order. Like transformers, derive the merges from the vocabulary: every split of a token into
/// two vocabulary entries is a merge, ranked by the merged token's position in the vocabulary
/// and, within one token, longest left part first.
fn merges_from_vocab<'a>(tokens: &'a [String], ids: &HashMap<&str, usize>) -> Vec<(&'a str, &'a str)> {
    tokens
        .iter()
        .flat_map(|t| t.char_indices().skip(1).map(|(k, _)| t.split_at(k)).collect::<Vec<_>>().into_iter().rev())
        .filter(|(a, b)| ids.contains_key(a) && ids.contains_key(b))
        .collect()
}

/// Control (and for SentencePiece, unknown) tokens are special: matched before normalization
/// and dropped by `skip_special_tokens`. User-defined tokens are matched whole but are text.
fn added_tokens(tokens: &[&str], types: &[i64], special: &[i64]) -> Vec<Json> {
    tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, ty))| special.contains(ty) || **ty == USER_DEFINED)
        .map(|(id, (content, ty))| {
            let special = special.contains(ty);
            json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": !special, "special": special})
        })
        .collect()
}

fn bos_post_processor(bos: &str, id: u64) -> Json {
    let bos_piece = |type_id: u32| json!({"SpecialToken": {"id": bos, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    json!({
        "type": "TemplateProcessing",
        "single": [bos_piece(0), seq("A", 0)],
        "pair": [bos_piece(0), seq("A", 0), bos_piece(1), seq("B", 1)],
        "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}}
    })
}
