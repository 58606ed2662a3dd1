//! Finding a model's tokenizer and template (folder or GGUF), and writing them as HF files.
use std::path::Path;

use serde_json::json;

use super::{ChatTemplate, Tokenizer};
use crate::error::{Error, Result};
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
