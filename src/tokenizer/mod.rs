//! Text <-> token ids, for HF-layout model folders and GGUF files alike, plus chat templates
//! and streaming detokenization.
pub mod detok;
mod files;
pub mod gguf;
pub mod template;

pub use files::{eos_ids, load_tokenizer, model_eos_ids};
pub use template::ChatTemplate;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// A loaded tokenizer and the special ids generation needs. Cloning is cheap (the vocabulary
/// is shared), so streams and requests can each hold one.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    bos: Option<u32>,
    bos_token: Option<String>,
    /// The first one is the tokenizer's own eos token when it has one.
    eos_ids: Vec<u32>,
    eos_token: Option<String>,
    /// tokenizer_config.json's `add_bos_token`, which transformers applies on top of whatever
    /// post-processor tokenizer.json declares.
    add_bos: Option<bool>,
}

impl Tokenizer {
    /// Loads `tokenizer.json`, with the special tokens from `tokenizer_config.json` and the end
    /// of generation ids from `generation_config.json` and `config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::ModelNotFound(dir.to_path_buf()));
        }
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::Tokenizer(format!("{}: not found", path.display())));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;

        let tok_cfg = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
        let gen_cfg = read_json(&dir.join("generation_config.json"))?.unwrap_or_default();
        let cfg = read_json(&dir.join("config.json"))?.unwrap_or_default();

        let bos_token = config_token(&tok_cfg, "bos_token").map(str::to_owned);
        let bos = bos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .or_else(|| json_ids(&gen_cfg["bos_token_id"]).into_iter().next())
            .or_else(|| json_ids(&cfg["bos_token_id"]).into_iter().next());
        let eos_token = config_token(&tok_cfg, "eos_token").map(str::to_owned);
        let mut eos_ids: Vec<u32> = eos_token
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .into_iter()
            .collect();
        for id in json_ids(&gen_cfg["eos_token_id"])
            .into_iter()
            .chain(json_ids(&cfg["eos_token_id"]))
        {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let add_bos = tok_cfg["add_bos_token"].as_bool();
        Ok(Self::assemble(
            inner, bos, bos_token, eos_ids, eos_token, add_bos,
        ))
    }

    /// Builds the tokenizer from the vocabulary embedded in a GGUF file.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let inner = gguf::tokenizer_from_gguf(g)?;
        let id = |key: &str| g.get_u64(key).and_then(|v| u32::try_from(v).ok());
        let bos = id("tokenizer.ggml.bos_token_id");
        // llama.cpp also stops on end-of-turn / end-of-message tokens (e.g. Gemma's
        // <end_of_turn>), which chat models emit instead of eos.
        let mut eos_ids = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(v) = id(key).filter(|v| !eos_ids.contains(v)) {
                eos_ids.push(v);
            }
        }
        // The BOS policy is already baked into the post-processor built from the metadata.
        Ok(Self::assemble(inner, bos, None, eos_ids, None, None))
    }

    fn assemble(
        inner: tokenizers::Tokenizer,
        bos: Option<u32>,
        bos_token: Option<String>,
        eos_ids: Vec<u32>,
        eos_token: Option<String>,
        add_bos: Option<bool>,
    ) -> Self {
        let bos_token = bos_token.or_else(|| inner.id_to_token(bos?));
        let eos_token = eos_token.or_else(|| inner.id_to_token(*eos_ids.first()?));
        Tokenizer {
            inner: Arc::new(inner),
            bos,
            bos_token,
            eos_ids,
            eos_token,
            add_bos,
        }
    }

    /// The `tokenizers` tokenizer itself (for llguidance's vocabulary, `sample::grammar`).
    pub fn inner(&self) -> &Arc<tokenizers::Tokenizer> {
        &self.inner
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut ids = enc.get_ids().to_vec();
        if let (true, Some(bos), Some(add_bos)) = (add_special_tokens, self.bos, self.add_bos) {
            // Tokens outside every input sequence were added by the post-processor.
            let added_bos =
                ids.first() == Some(&bos) && enc.get_sequence_ids().first() == Some(&None);
            if add_bos && ids.first() != Some(&bos) {
                ids.insert(0, bos);
            } else if !add_bos && added_bos {
                ids.remove(0);
            }
        }
        Ok(ids)
    }

    /// The prompt for chat `messages`: the template's rendering, tokenized as is (the template
    /// writes the special tokens itself).
    pub fn encode_chat(&self, template: &template::ChatTemplate, messages: &Json, opts: &template::RenderOptions) -> Result<Vec<u32>> {
        self.encode(&template.render(messages, opts)?, false)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// Every id that ends generation.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_token(&self) -> Option<String> {
        self.bos_token.clone()
    }

    pub fn eos_token(&self) -> Option<String> {
        self.eos_token.clone()
    }

    /// The ids an embedding pools (mlx-bun's `embedOne`): the text, with its instruction, encoded
    /// without special tokens, then the end-of-text token whose last hidden state is the vector
    /// (`<|endoftext|>`, 151643 in Qwen3-Embedding's vocabulary; a vocabulary without it ends
    /// with its end-of-sequence token).
    pub fn embedding_input(&self, text: &str, instruction: Option<&str>) -> Result<Vec<u32>> {
        let mut ids = self.encode(&with_instruction(text, instruction), false)?;
        ids.push(self.end_of_text_id()?);
        Ok(ids)
    }

    /// The token an embedding is pooled at.
    pub fn end_of_text_id(&self) -> Result<u32> {
        self.token_to_id("<|endoftext|>")
            .or_else(|| self.eos_ids.first().copied())
            .ok_or_else(|| Error::Tokenizer("the tokenizer has no <|endoftext|> or end-of-sequence token to pool an embedding at".into()))
    }
}

/// mlx-bun's `withInstruction`: Qwen3-Embedding's query format. Only queries carry a task
/// instruction; documents go in as they are (as does an empty instruction).
pub fn with_instruction(text: &str, instruction: Option<&str>) -> String {
    match instruction.filter(|i| !i.is_empty()) {
        Some(i) => format!("Instruct: {i}\nQuery:{text}"),
        None => text.to_string(),
    }
}

/// Summarized: the derived form would print the whole vocabulary.
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

/// Parses an optional JSON file: `Ok(None)` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Json>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::config(path, e.to_string()))
}

/// A special token in tokenizer_config.json: a plain string, or a serialized AddedToken
/// (`{"content": "<s>", ...}`) as older transformers versions wrote it.
fn config_token<'a>(cfg: &'a Json, key: &str) -> Option<&'a str> {
    let v = &cfg[key];
    v.as_str().or_else(|| v["content"].as_str())
}

/// `eos_token_id` and friends: an integer or a list of integers.
fn json_ids(v: &Json) -> Vec<u32> {
    let one = |v: &Json| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        Json::Array(items) => items.iter().filter_map(one).collect(),
        v => one(v).into_iter().collect(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A temp folder removed on drop.
    pub(crate) struct TempDir(pub(crate) PathBuf);

    impl TempDir {
        pub(crate) fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let name = format!(
                "mlx-bun-tok-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let dir = std::env::temp_dir().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        pub(crate) fn write(&self, name: &str, contents: &str) -> &Self {
            std::fs::write(self.0.join(name), contents).unwrap();
            self
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A word-level tokenizer.json: enough to exercise the config handling.
    pub(crate) fn word_level_json(post_processor_bos: bool) -> String {
        let post = if post_processor_bos {
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
            })
        } else {
            Json::Null
        };
        json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 6, "content": "<eot>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": post,
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
            "model": {"type": "WordLevel", "unk_token": "<unk>",
                      "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "again": 5, "<eot>": 6}}
        })
        .to_string()
    }

    #[test]
    fn from_dir_reads_special_tokens_from_configs() {
        let dir = TempDir::new();
        dir.write("tokenizer.json", &word_level_json(false))
            .write(
                "tokenizer_config.json",
                r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": true}"#,
            )
            .write("generation_config.json", r#"{"eos_token_id": [2, 6]}"#)
            .write("config.json", r#"{"eos_token_id": 5, "bos_token_id": 1}"#);
        let tok = Tokenizer::from_dir(&dir.0).unwrap();
        assert_eq!(tok.bos_token_id(), Some(1));
        assert_eq!(tok.eos_token_ids(), [2, 6, 5]);
        assert_eq!(
            (tok.bos_token().as_deref(), tok.eos_token().as_deref()),
            (Some("<s>"), Some("</s>"))
        );
        assert_eq!(tok.vocab_size(), 7);
        assert_eq!(
            (tok.token_to_id("world"), tok.id_to_token(3).as_deref()),
            (Some(4), Some("hello"))
        );
        // add_bos_token supplies the BOS the post-processor does not add.
        assert_eq!(tok.encode("hello world", true).unwrap(), [1, 3, 4]);
        assert_eq!(tok.encode("hello world", false).unwrap(), [3, 4]);
        assert_eq!(tok.encode("<s> hello", true).unwrap(), [1, 3]);
        assert_eq!(tok.decode(&[1, 3, 4, 2], true).unwrap(), "hello world");
        assert_eq!(
            tok.decode(&[1, 3, 4, 2], false).unwrap(),
            "<s> hello world </s>"
        );
    }

    /// generate()'s default stop set, read without building the tokenizer where the json files
    /// name the eos token, and equal to the tokenizer's own where they do not.
    #[test]
    fn model_eos_ids_merge_config_generation_config_and_the_eos_token() {
        let config = r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 8,
                        "num_attention_heads": 1, "vocab_size": 7, "eos_token_id": 5}"#;
        let eos = |tokenizer_config: &str| {
            let dir = TempDir::new();
            dir.write("tokenizer.json", &word_level_json(false))
                .write("tokenizer_config.json", tokenizer_config)
                .write("generation_config.json", r#"{"eos_token_id": [2]}"#)
                .write("config.json", config);
            let ids = model_eos_ids(&crate::model::config::ModelConfig::load(&dir.0).unwrap());
            let merged = eos_ids(&crate::model::config::ModelConfig::load(&dir.0).unwrap(), &Tokenizer::from_dir(&dir.0).unwrap());
            let mut sorted = merged.clone();
            sorted.sort();
            let mut ours = ids.clone();
            ours.sort();
            assert_eq!(ours, sorted, "the server's set for {tokenizer_config}");
            ids
        };
        // From added_tokens_decoder, from tokenizer.json's added tokens, from the vocabulary.
        assert_eq!(eos(r#"{"eos_token": "<eot>", "added_tokens_decoder": {"6": {"content": "<eot>"}}}"#), [5, 2, 6]);
        assert_eq!(eos(r#"{"eos_token": "<eot>"}"#), [5, 2, 6]);
        assert_eq!(eos(r#"{"eos_token": "world"}"#), [5, 2, 4]);
        assert_eq!(eos(r#"{}"#), [5, 2]);
    }

    #[test]
    fn add_bos_token_false_removes_only_the_post_processor_bos() {
        let dir = TempDir::new();
        dir.write("tokenizer.json", &word_level_json(true));
        assert_eq!(
            Tokenizer::from_dir(&dir.0)
                .unwrap()
                .encode("hello", true)
                .unwrap(),
            [1, 3]
        );

        dir.write(
            "tokenizer_config.json",
            r#"{"bos_token": "<s>", "add_bos_token": false}"#,
        );
        let tok = Tokenizer::from_dir(&dir.0).unwrap();
        assert_eq!(tok.encode("hello", true).unwrap(), [3]);
        // A BOS written in the text itself stays.
        assert_eq!(tok.encode("<s> hello", true).unwrap(), [1, 3]);
        // Without tokenizer_config.json, bos comes from config.json.
        let dir = TempDir::new();
        dir.write("tokenizer.json", &word_level_json(false))
            .write("config.json", r#"{"bos_token_id": 1}"#);
        let tok = Tokenizer::from_dir(&dir.0).unwrap();
        assert_eq!(
            (
                tok.bos_token_id(),
                tok.bos_token().as_deref(),
                tok.eos_token()
            ),
            (Some(1), Some("<s>"), None)
        );
    }

    #[test]
    fn from_dir_errors_name_the_file() {
        let err = Tokenizer::from_dir(Path::new("/nonexistent/model")).unwrap_err();
        assert!(matches!(err, Error::ModelNotFound(_)), "{err:?}");

        let dir = TempDir::new();
        let err = Tokenizer::from_dir(&dir.0).unwrap_err();
        assert!(
            matches!(&err, Error::Tokenizer(m) if m.contains("tokenizer.json: not found")),
            "{err:?}"
        );

        dir.write("tokenizer.json", "{\"model\": 1}");
        let err = Tokenizer::from_dir(&dir.0).unwrap_err();
        assert!(
            matches!(&err, Error::Tokenizer(m) if m.contains("tokenizer.json")),
            "{err:?}"
        );

        dir.write("tokenizer.json", &word_level_json(false))
            .write("tokenizer_config.json", "{oops");
        let err = Tokenizer::from_dir(&dir.0).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig { path, .. } if path.ends_with("tokenizer_config.json")),
            "{err:?}"
        );
    }
}
