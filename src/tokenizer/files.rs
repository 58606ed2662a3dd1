//! Finding a model's tokenizer and template (folder or GGUF), and writing them as HF files.
use std::path::Path;

use serde_json::json;

use super::{config_token, json_ids, read_json, ChatTemplate, Tokenizer};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::gguf::Gguf;

/// The tokenizer and chat template (if any) of a model folder or `.gguf` file.
pub fn load_tokenizer(path: &Path) -> Result<(Tokenizer, Option<ChatTemplate>)> {
    if !path.exists() {
        return Err(Error::ModelNotFound(path.to_path_buf()));
    }
    if path.is_file() {
        let g = Gguf::open(path)?;
        return Ok((Tokenizer::from_gguf(&g)?, ChatTemplate::from_gguf(&g)?));
    }
    Ok((Tokenizer::from_dir(path)?, ChatTemplate::from_dir(path)?))
}

/// config.json's end-of-sequence ids, then any the tokenizer adds (generation_config.json,
/// its own eos token), each once: where generations stop unless a request says otherwise.
pub fn eos_ids(config: &ModelConfig, tokenizer: &Tokenizer) -> Vec<u32> {
    let mut eos = config.eos_token_ids.clone();
    eos.extend(tokenizer.eos_token_ids().iter().filter(|id| !config.eos_token_ids.contains(id)));
    eos
}

/// `eos_ids` for a model known by its config alone (`generate()` gets no tokenizer), read from
/// a folder's json files: generation_config.json's ids, and the id of tokenizer_config.json's
/// `eos_token` from its `added_tokens_decoder`, else from tokenizer.json's added tokens. Building
/// the whole tokenizer takes a second for a large vocabulary (Gemma 3's), so it is done only when
/// neither lists the token. A GGUF's header already names its tokenizer's eos token. A file
/// that cannot be read adds nothing: the model still runs on token ids, and `loadTokenizer`
/// reports what is wrong with it.
pub fn model_eos_ids(config: &ModelConfig) -> Vec<u32> {
    let dir = config.model_path();
    let mut eos = config.eos_token_ids.clone();
    if dir.is_dir() {
        if let Ok(Some(gen)) = read_json(&dir.join("generation_config.json")) {
            eos.extend(json_ids(&gen["eos_token_id"]));
        }
        eos.extend(tokenizer_eos(&dir));
    }
    dedup(eos)
}

/// The id of the folder's own eos token (see `model_eos_ids`).
fn tokenizer_eos(dir: &Path) -> Vec<u32> {
    let Ok(Some(tok)) = read_json(&dir.join("tokenizer_config.json")) else { return Vec::new() };
    let Some(token) = config_token(&tok, "eos_token") else { return Vec::new() };
    let listed = tok["added_tokens_decoder"].as_object().and_then(|table| {
        table.iter().find(|(_, t)| t["content"].as_str() == Some(token)).and_then(|(id, _)| id.parse::<u32>().ok())
    });
    let id = listed.or_else(|| added_token_id(&dir.join("tokenizer.json"), token));
    match id {
        Some(id) => vec![id],
        None => Tokenizer::from_dir(dir).map(|t| t.eos_token_ids().to_vec()).unwrap_or_default(),
    }
}

/// The id of `token` among tokenizer.json's added tokens, where special tokens are listed;
/// the vocabulary and merges are skipped unparsed, not built.
fn added_token_id(path: &Path, token: &str) -> Option<u32> {
    #[derive(serde::Deserialize)]
    struct Added {
        id: u32,
        content: String,
    }
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        added_tokens: Vec<Added>,
    }
    let file: File = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    file.added_tokens.into_iter().find(|a| a.content == token).map(|a| a.id)
}

/// `ids` in order, each once.
fn dedup(ids: Vec<u32>) -> Vec<u32> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

impl Tokenizer {
    /// Writes tokenizer.json and tokenizer_config.json (with the chat template) into `dir`, as
    /// transformers and mlx-lm read them.
    pub fn save_dir(&self, dir: &Path, chat_template: Option<&str>) -> Result<()> {
        let json = self.inner.to_string(false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json).map_err(|e| Error::io(&path, e))?;
        let probe_special = self.inner.encode_fast("a", true).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let probe_plain = self.inner.encode_fast("a", false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let add_bos = probe_special.get_ids().len() > probe_plain.get_ids().len()
            && probe_special.get_ids().first().copied() == self.bos;
        let mut cfg = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_bos_token": add_bos,
            "add_eos_token": false,
            "clean_up_tokenization_spaces": false,
        });
        if let Some(t) = chat_template {
            cfg["chat_template"] = json!(t);
        }
        let path = dir.join("tokenizer_config.json");
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| Error::Tokenizer(e.to_string()))?;
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    }
}
