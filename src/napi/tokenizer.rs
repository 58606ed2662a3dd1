//! Tokenizer, chat template and streaming detokenizer for JavaScript.
use napi::bindgen_prelude::{Either, Uint32Array};
use napi_derive::napi;
use serde_json::Value;

use super::convert::{prompt_tokens, render_options};
use super::js_error;
use crate::tokenizer::detok::StreamDecoder as CoreDecoder;
use crate::tokenizer::{load_tokenizer, ChatTemplate as CoreTemplate, Tokenizer as CoreTokenizer};

#[napi]
pub struct Tokenizer {
    inner: CoreTokenizer,
}

/// Loads the tokenizer of a model folder (tokenizer.json) or GGUF file (its metadata).
#[napi(catch_unwind)]
pub fn load_tokenizer_native(path: String) -> napi::Result<Tokenizer> {
    let (inner, _) = load_tokenizer(std::path::Path::new(&path)).map_err(js_error)?;
    Ok(Tokenizer { inner })
}

impl Tokenizer {
    pub(super) fn core(&self) -> &CoreTokenizer {
        &self.inner
    }
}

#[napi]
impl Tokenizer {
    #[napi(catch_unwind)]
    pub fn encode(&self, text: String, add_special_tokens: Option<bool>) -> napi::Result<Uint32Array> {
        self.inner.encode(&text, add_special_tokens.unwrap_or(true)).map(Uint32Array::new).map_err(js_error)
    }

    #[napi(catch_unwind)]
    pub fn decode(&self, ids: Either<Uint32Array, Vec<f64>>, skip_special_tokens: Option<bool>) -> napi::Result<String> {
        let ids = prompt_tokens(ids).map_err(js_error)?;
        self.inner.decode(&ids, skip_special_tokens.unwrap_or(false)).map_err(js_error)
    }

    #[napi(catch_unwind)]
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    #[napi(catch_unwind)]
    pub fn token_to_id(&self, token: String) -> Option<u32> {
        self.inner.token_to_id(&token)
    }

    #[napi(getter, catch_unwind)]
    pub fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos_token_id()
    }

    /// The first end-of-sequence id (mlx-bun's `eosTokenId`).
    #[napi(getter, catch_unwind)]
    pub fn eos_token_id(&self) -> Option<u32> {
        self.inner.eos_token_ids().first().copied()
    }

    #[napi(getter, catch_unwind)]
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.inner.eos_token_ids().to_vec()
    }

    #[napi(getter, catch_unwind)]
    pub fn vocab_size(&self) -> u32 {
        self.inner.vocab_size() as u32
    }

    /// A detokenizer that turns tokens into text as they arrive, never splitting a character.
    #[napi(catch_unwind)]
    pub fn create_decoder(&self, skip_special_tokens: Option<bool>) -> StreamDecoder {
        StreamDecoder { inner: CoreDecoder::new(&self.inner, skip_special_tokens.unwrap_or(true)) }
    }
}

#[napi]
pub struct StreamDecoder {
    inner: CoreDecoder,
}

#[napi]
impl StreamDecoder {
    /// Text completed by these tokens (possibly empty while a character is incomplete).
    #[napi(catch_unwind)]
    pub fn push(&mut self, ids: Either<Uint32Array, Vec<f64>>) -> napi::Result<String> {
        let ids = prompt_tokens(ids).map_err(js_error)?;
        let mut text = String::new();
        for id in ids {
            text.push_str(&self.inner.push(id).map_err(js_error)?);
        }
        Ok(text)
    }

    /// Whatever text is still held back.
    #[napi(catch_unwind)]
    pub fn flush(&mut self) -> napi::Result<String> {
        self.inner.finish().map_err(js_error)
    }
}

#[napi(object)]
pub struct RenderOptionsJs {
    pub add_generation_prompt: Option<bool>,
    pub tools: Option<Value>,
    /// Passed to the template as `enable_thinking` (Qwen3-style reasoning switches).
    pub enable_thinking: Option<bool>,
    /// Extra template variables.
    pub extra: Option<serde_json::Map<String, Value>>,
}

#[napi]
pub struct ChatTemplate {
    inner: CoreTemplate,
}

impl ChatTemplate {
    pub(super) fn core(&self) -> &CoreTemplate {
        &self.inner
    }
}

#[napi]
impl ChatTemplate {
    /// The model's own template from a folder (tokenizer_config.json or chat_template.jinja) or a
    /// GGUF file; `null` when the model has none.
    #[napi(catch_unwind)]
    pub fn load(path: String) -> napi::Result<Option<ChatTemplate>> {
        let (_, template) = load_tokenizer(std::path::Path::new(&path)).map_err(js_error)?;
        Ok(template.map(|inner| ChatTemplate { inner }))
    }

    #[napi(catch_unwind)]
    pub fn from_string(source: String, bos_token: Option<String>, eos_token: Option<String>) -> napi::Result<ChatTemplate> {
        CoreTemplate::new(source, bos_token, eos_token).map(|inner| ChatTemplate { inner }).map_err(js_error)
    }

    #[napi(catch_unwind)]
    pub fn render(&self, messages: Value, options: Option<RenderOptionsJs>) -> napi::Result<String> {
        self.inner.render(&messages, &render_options(options)).map_err(js_error)
    }

    #[napi(getter, catch_unwind)]
    pub fn source(&self) -> String {
        self.inner.source().to_owned()
    }

    /// `'think-tag'`, `'gemma-channel'` or `null` (mlx-bun's `thinkingFormat`).
    #[napi(getter, catch_unwind)]
    pub fn thinking_format(&self) -> Option<&'static str> {
        self.inner.thinking_format().map(|f| f.name())
    }

    #[napi(getter, catch_unwind)]
    pub fn supports_thinking(&self) -> bool {
        self.inner.thinking_format().is_some()
    }
}
