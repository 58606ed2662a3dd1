//! Finding a model's tokenizer and template (folder or GGUF), and writing them as HF files.
use std::path::Path;

use serde_json::json;

use super::{ChatTemplate, Tokenizer};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::gguf::Gguf;

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

/// `eos_ids` for a model known by its config alone (`generate()` gets no tokenizer): a folder's
/// tokenizer is read for it. A GGUF's header already names its tokenizer's eos token, and a
/// folder without a usable tokenizer keeps config.json's ids (it still runs on token ids;
/// `loadTokenizer` reports what is wrong with the tokenizer).
pub fn model_eos_ids(config: &ModelConfig) -> Vec<u32> {
    let dir = config.model_path();
    match dir.join("tokenizer.json").is_file().then(|| Tokenizer::from_dir(&dir)) {
        Some(Ok(tokenizer)) => eos_ids(config, &tokenizer),
        _ => config.eos_token_ids.clone(),
    }
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
