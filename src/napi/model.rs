//! Model loading for JavaScript: `loadModelConfig`, `Weights`, `createModel`, `loadModel` and the
//! `Model` handle. MLX work happens on the engine thread; these only parse, convert and forward.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::{Either, Float32Array, PromiseRaw, Uint32Array, Uint8Array};
use napi::Env;
use napi_derive::napi;
use serde_json::{json, Value};

use super::convert::prompt_tokens;
use super::tokenizer::Tokenizer;
use super::js_error;
use crate::engine::inference::CacheHandle;
use crate::engine::{EngineThread, ModelId, WeightsSource};
use crate::error::Error;
use crate::model::config::ModelConfig;
use crate::model::text::text_config;
use crate::model::{open_config, open_source};
use crate::model::weights::{F32Matmuls, Weights as CoreWeights};

/// The config summary mlx-bun's `loadModelConfig` returns.
pub fn config_json(c: &ModelConfig) -> Value {
    let quantization = c.quantization.as_ref().map(|q| {
        let per_layer: serde_json::Map<String, Value> = q
            .per_layer
            .iter()
            .map(|(k, v)| (k.clone(), v.map_or(Value::Bool(false), |p| json!({"bits": p.bits, "groupSize": p.group_size}))))
            .collect();
        json!({"default": {"bits": q.bits, "groupSize": q.group_size, "mode": "affine"}, "perLayer": per_layer})
    });
    let kv_quant = c.kv_quant.as_ref().map(|specs| {
        specs.iter().map(|s| json!({"layerIdx": s.layer_idx, "bits": s.bits, "groupSize": s.group_size})).collect::<Vec<_>>()
    });
    let dir = c.model_path();
    json!({
        "modelDir": dir,
        "modelType": c.model_type,
        "architectures": c.architectures,
        "text": text_config(c),
        "dtype": c.torch_dtype,
        "vocabSize": c.vocab_size,
        "quantization": quantization,
        "kvQuant": kv_quant,
        "hasVisionSidecar": c.has_vision_sidecar,
        "eosTokenIds": c.eos_token_ids,
        "raw": c.raw,
    })
}

/// Reads a model's configuration from a folder's config.json or a GGUF file's metadata.
#[napi(catch_unwind)]
pub fn load_model_config(path: String) -> napi::Result<Value> {
    open_config(Path::new(&path)).map(|c| config_json(&c)).map_err(js_error)
}

#[napi(object)]
pub struct TensorInfo {
    pub dtype: String,
    pub shape: Vec<u32>,
}

#[napi(object)]
pub struct TensorData {
    pub dtype: String,
    pub shape: Vec<u32>,
    /// Raw little-endian bytes.
    pub data: Uint8Array,
}

/// The tensors of a model folder or GGUF file, opened without loading them into MLX. A folder's
/// safetensors are mapped at once (cheap); a GGUF file's tensors are converted to MLX's layout on
/// first use, because converting a whole file takes seconds: `createModel` has the engine thread
/// do it, while `tensorNames`/`tensor()` of a GGUF do it on the caller's thread, once.
#[napi]
pub struct Weights {
    inner: Option<Arc<Opened>>,
}

struct Opened {
    path: std::path::PathBuf,
    config: ModelConfig,
    tensors: std::sync::Mutex<Option<CoreWeights>>,
}

impl Opened {
    fn tensors(&self) -> crate::error::Result<CoreWeights> {
        let mut tensors = self.tensors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = tensors.as_ref() {
            return Ok(t.clone());
        }
        let (converted, _) = open_source(&self.path)?;
        *tensors = Some(converted.clone());
        Ok(converted)
    }
}

impl Weights {
    fn get(&self) -> napi::Result<&Arc<Opened>> {
        self.inner.as_ref().ok_or_else(|| js_error(Error::option("weights", "this Weights has been disposed")))
    }

    fn tensors(&self) -> napi::Result<CoreWeights> {
        self.get()?.tensors().map_err(js_error)
    }
}

#[napi]
impl Weights {
    #[napi(catch_unwind)]
    pub fn open(path: String) -> napi::Result<Weights> {
        let path = Path::new(&path);
        let opened = if path.is_file() {
            Opened { path: path.to_path_buf(), config: open_config(path).map_err(js_error)?, tensors: Default::default() }
        } else {
            let (tensors, config) = open_source(path).map_err(js_error)?;
            Opened { path: path.to_path_buf(), config, tensors: std::sync::Mutex::new(Some(tensors)) }
        };
        Ok(Weights { inner: Some(Arc::new(opened)) })
    }

    #[napi(getter, catch_unwind)]
    pub fn tensor_names(&self) -> napi::Result<Vec<String>> {
        Ok(self.tensors()?.names().map(str::to_owned).collect())
    }

    #[napi(catch_unwind)]
    pub fn has(&self, name: String) -> napi::Result<bool> {
        Ok(self.tensors()?.has(&name))
    }

    #[napi(catch_unwind)]
    pub fn info(&self, name: String) -> napi::Result<Option<TensorInfo>> {
        Ok(self.tensors()?.get(&name).map(|t| TensorInfo { dtype: dtype_name(t.dtype), shape: shape(&t.shape) }))
    }

    #[napi(catch_unwind)]
    pub fn tensor(&self, name: String) -> napi::Result<TensorData> {
        let tensors = self.tensors()?;
        let t = tensors.get(&name).ok_or_else(|| js_error(Error::tensor(&name, "not in these weights")))?;
        Ok(TensorData { dtype: dtype_name(t.dtype), shape: shape(&t.shape), data: Uint8Array::new(t.bytes().to_vec()) })
    }

    #[napi(catch_unwind)]
    pub fn dispose(&mut self) {
        self.inner = None;
    }
}

fn dtype_name(d: crate::model::weights::DType) -> String {
    serde_json::to_value(d).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn shape(s: &[usize]) -> Vec<u32> {
    s.iter().map(|&d| d as u32).collect()
}

/// A model resident on the engine thread. `createModel` returns it at once; its load runs on the
/// engine thread, work on it queues behind the load, and `ready` (`loaded()`) says how it ended.
#[napi]
pub struct Model {
    id: ModelId,
    config: ModelConfig,
    disposed: Arc<AtomicBool>,
    load: Arc<tokio::sync::Mutex<Load>>,
}

pub(super) enum Load {
    Pending(tokio::sync::oneshot::Receiver<crate::error::Result<()>>),
    /// The outcome, with a failure as its coded message (`js_error`'s form).
    Done(std::result::Result<(), String>),
}

fn start_load(weights: WeightsSource, config: ModelConfig) -> Model {
    let (id, loaded) = EngineThread::get().load(weights, config.clone());
    Model { id, config, disposed: Arc::new(AtomicBool::new(false)), load: Arc::new(tokio::sync::Mutex::new(Load::Pending(loaded))) }
}

/// How a model is built (`model::weights::F32Matmuls`).
#[napi(object)]
pub struct LoadOptions {
    pub f32_matmuls: Option<String>,
}

pub(super) fn f32_matmuls(options: Option<LoadOptions>) -> napi::Result<F32Matmuls> {
    options.and_then(|o| o.f32_matmuls).map_or(Ok(F32Matmuls::default()), |choice| choice.parse::<F32Matmuls>().map_err(js_error))
}

/// Builds the model for `weights` on the engine thread and returns it at once, as mlx-bun's
/// `createModel` does (a GGUF's tensors are converted there too, never on the JS thread).
/// `config` (from `loadModelConfig`) overrides the configuration found beside the weights.
#[napi(catch_unwind)]
pub fn create_model(weights: &Weights, config: Option<Value>, options: Option<LoadOptions>) -> napi::Result<Model> {
    let opened = weights.get()?.clone();
    let layout = f32_matmuls(options)?;
    let c = match config {
        Some(v) => {
            let raw = v.get("raw").cloned().unwrap_or(v);
            ModelConfig::from_value(raw, opened.config.source.clone()).map_err(js_error)?
        }
        None => opened.config.clone(),
    };
    Ok(start_load(Box::new(move || Ok(opened.tensors()?.with_f32_matmuls(layout))), c))
}

/// Opens and loads a model folder or GGUF file in one step; resolves once it is loaded.
#[napi]
pub async fn load_model(path: String, options: Option<LoadOptions>) -> napi::Result<Model> {
    let layout = f32_matmuls(options)?;
    let (w, c) = open_source(Path::new(&path)).map_err(js_error)?;
    let model = start_load(Box::new(move || Ok(w.with_f32_matmuls(layout))), c);
    wait_loaded(model.load.clone()).await?;
    Ok(model)
}

/// Waits for a model's load (see `Model::loaded`).
pub(super) async fn wait_loaded(load: Arc<tokio::sync::Mutex<Load>>) -> napi::Result<()> {
    let mut load = load.lock().await;
    if let Load::Pending(loaded) = &mut *load {
        let outcome = loaded.await.unwrap_or(Err(Error::EngineDead));
        *load = Load::Done(outcome.map_err(|e| format!("{}: {e}", e.code())));
    }
    match &*load {
        Load::Done(Err(message)) => Err(napi::Error::from_reason(message.clone())),
        _ => Ok(()),
    }
}

#[napi]
impl Model {
    #[napi(getter, catch_unwind)]
    pub fn config(&self) -> Value {
        config_json(&self.config)
    }

    fn live(&self) -> napi::Result<ModelId> {
        if self.disposed.load(Ordering::Acquire) {
            return Err(js_error(Error::ModelDisposed));
        }
        Ok(self.id)
    }

    /// The engine-thread id of a live model, its configuration and its disposed flag.
    pub(super) fn handle(&self) -> napi::Result<(ModelId, &ModelConfig, Arc<AtomicBool>)> {
        Ok((self.live()?, &self.config, self.disposed.clone()))
    }

    /// Resolves once the model is loaded; rejects with the load's typed error. (Promises own
    /// what they wait on, never `self`: see `NativeSession::next_batch`.)
    #[napi(catch_unwind)]
    pub fn loaded<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
        env.spawn_future(wait_loaded(self.load.clone()))
    }

    /// Last-position logits of `prompt` on a fresh cache, prefilled in chunks on the engine thread.
    #[napi(catch_unwind)]
    pub fn logits<'env>(&self, env: &'env Env, prompt: Either<Uint32Array, Vec<f64>>) -> napi::Result<PromiseRaw<'env, Float32Array>> {
        let id = self.live()?;
        let prompt = prompt_tokens(prompt).map_err(js_error)?;
        env.spawn_future(async move {
            let v = EngineThread::get().logits(id, prompt).await.map_err(|_| js_error(Error::EngineDead))?.map_err(js_error)?;
            Ok(Float32Array::new(v))
        })
    }

    /// Each row's embedding (mlx-bun's `embedPooled`): its last hidden state after the final
    /// norm, L2-normalised; the rows run as padded batches on the engine thread.
    #[napi(catch_unwind)]
    pub fn embed_pooled<'env>(&self, env: &'env Env, rows: Vec<Either<Uint32Array, Vec<f64>>>) -> napi::Result<PromiseRaw<'env, Vec<Float32Array>>> {
        let id = self.live()?;
        let rows = rows.into_iter().map(prompt_tokens).collect::<crate::error::Result<Vec<_>>>().map_err(js_error)?;
        env.spawn_future(async move {
            let v = EngineThread::get().embed(id, rows).await.map_err(|_| js_error(Error::EngineDead))?.map_err(js_error)?;
            Ok(v.into_iter().map(Float32Array::new).collect())
        })
    }

    /// A KV cache of this model the caller keeps between generations (`generate(..., { cache })`).
    #[napi(catch_unwind)]
    pub fn make_cache(&self) -> napi::Result<KvCache> {
        Ok(KvCache { inner: CacheHandle::new(self.live()?) })
    }

    /// Frees the weights on the engine thread once running generations finish.
    #[napi(catch_unwind)]
    pub fn dispose(&self) {
        if !self.disposed.swap(true, Ordering::AcqRel) {
            EngineThread::get().unload(self.id);
        }
    }
}

/// A caller-owned KV cache; its layers live on the engine thread (`engine::inference::CacheHandle`).
#[napi]
pub struct KvCache {
    inner: CacheHandle,
}

impl KvCache {
    pub(super) fn handle(&self) -> &CacheHandle {
        &self.inner
    }
}

#[napi]
impl KvCache {
    /// Positions held: the prompts and tokens forwarded by the generations that used it.
    #[napi(getter, catch_unwind)]
    pub fn offset(&self) -> f64 {
        self.inner.offset() as f64
    }

    /// Frees its memory; a later use throws `INVALID_OPTION`.
    #[napi(catch_unwind)]
    pub fn dispose(&self) {
        self.inner.dispose();
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        self.dispose();
    }
}

/// Saves a caller cache to a file (`saveKvCache(cache, path)`): a versioned file fingerprinted to
/// its model, written through a temporary file. Rejects while a generation uses the cache.
#[napi(catch_unwind)]
pub fn save_kv_cache<'env>(env: &'env Env, cache: &KvCache, path: String) -> napi::Result<PromiseRaw<'env, ()>> {
    let saved = cache.inner.save(PathBuf::from(path)).map_err(js_error)?;
    env.spawn_future(async move { saved.await.map_err(js_error) })
}

/// A new cache of `model` restored from a file `saveKvCache` wrote (`loadKvCache(model, path)`);
/// a file of another model, of another version, or damaged rejects with `INVALID_CACHE_FILE`.
#[napi(catch_unwind)]
pub fn load_kv_cache<'env>(env: &'env Env, model: &Model, path: String) -> napi::Result<PromiseRaw<'env, KvCache>> {
    let loaded = CacheHandle::load(model.live()?, PathBuf::from(path));
    env.spawn_future(async move { Ok(KvCache { inner: loaded.await.map_err(js_error)? }) })
}

/// One text's embedding (mlx-bun's `EmbedResult`).
#[napi(object)]
pub struct EmbedResult {
    /// L2-normalised; as long as the model's hidden size.
    pub vector: Float32Array,
    /// Ids embedded, the pooled end-of-text token included.
    pub tokens: u32,
}

/// `embedMany(model, tokenizer, texts, instruction?)`: the texts are tokenized off the JS thread,
/// then embedded in padded batches on the engine thread.
#[napi(catch_unwind)]
pub fn embed_native<'env>(env: &'env Env, model: &Model, tokenizer: &Tokenizer, texts: Vec<String>, instruction: Option<String>) -> napi::Result<PromiseRaw<'env, Vec<EmbedResult>>> {
    let id = model.live()?;
    let tokenizer = tokenizer.core().clone();
    env.spawn_future(async move {
        let (counts, vectors) = EngineThread::get().embed_texts(id, &tokenizer, &texts, instruction.as_deref()).map_err(js_error)?;
        let vectors = vectors.await.map_err(|_| js_error(Error::EngineDead))?.map_err(js_error)?;
        Ok(vectors.into_iter().zip(counts).map(|(v, n)| EmbedResult { vector: Float32Array::new(v), tokens: n as u32 }).collect())
    })
}

/// mlx-bun's `withInstruction(text, instruction?)`.
#[napi(catch_unwind)]
pub fn with_instruction_native(text: String, instruction: Option<String>) -> String {
    crate::tokenizer::with_instruction(&text, instruction.as_deref())
}
