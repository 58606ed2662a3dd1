//! Caller-owned KV caches (mlx-bun's `model.makeCache()` passed as `generate(..., { cache })`):
//! a conversation's caches kept by the caller between generations. The layers live on the engine
//! thread, in a store keyed by the handle's id; the handle the caller holds carries the model, the
//! offset (positions held, read on the caller's thread) and whether a generation is using it.
//! A generation takes the layers when it starts, treats the prompt's first `offset` tokens as
//! already in them, and gives them back holding the prompt and every token it forwarded. The
//! handle itself is `inference::CacheHandle`; this is the state it shares with the thread.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use std::path::Path;

use super::models::ModelId;
use crate::cache::file::{self, Expected};
use crate::cache::LayerCache;
use crate::error::{Error, Result};
use crate::model::LanguageModel;

static NEXT_CACHE: AtomicU64 = AtomicU64::new(1);

/// The engine thread's layers of every caller cache that holds positions.
pub type CallerCaches = Rc<RefCell<HashMap<u64, Vec<LayerCache>>>>;

pub struct CacheState {
    pub id: u64,
    pub model: ModelId,
    offset: AtomicU64,
    busy: AtomicBool,
    disposed: AtomicBool,
}

impl CacheState {
    pub fn new(model: ModelId) -> Arc<Self> {
        let id = NEXT_CACHE.fetch_add(1, Ordering::Relaxed);
        Arc::new(CacheState { id, model, offset: AtomicU64::new(0), busy: AtomicBool::new(false), disposed: AtomicBool::new(false) })
    }

    /// Positions the cache holds (as of the end of its last generation).
    pub fn offset(&self) -> u64 {
        self.offset.load(Ordering::Acquire)
    }

    /// The cache for one generation over `prompt_len` tokens of `model`; it must hold fewer
    /// positions than the prompt, belong to the model, be live and not in use.
    pub fn lease(self: &Arc<Self>, model: ModelId, prompt_len: usize) -> Result<CacheLease> {
        if self.disposed.load(Ordering::Acquire) {
            return Err(Error::option("cache", "was disposed"));
        }
        if self.model != model {
            return Err(Error::option("cache", "was made by another model"));
        }
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(Error::option("cache", "is in use by another generation"));
        }
        let lease = CacheLease(self.clone());
        let offset = self.offset();
        if offset >= prompt_len as u64 {
            return Err(Error::option("cache", format!("holds {offset} positions; the prompt must be longer (it has {prompt_len} tokens)")));
        }
        Ok(lease)
    }

    /// Later use fails; returns whether this call disposed it (then its layers must go).
    pub fn dispose(&self) -> bool {
        !self.disposed.swap(true, Ordering::AcqRel)
    }
}

/// One generation's use of a caller cache; the cache is free again when it drops.
pub struct CacheLease(Arc<CacheState>);

impl CacheLease {
    pub fn model(&self) -> ModelId {
        self.0.model
    }

    /// The layers, from `store`, or none yet (the generation makes fresh ones).
    pub fn take(&self, store: &CallerCaches) -> Option<Vec<LayerCache>> {
        store.borrow_mut().remove(&self.0.id)
    }

    /// Puts the layers back, trimmed to the positions every layer holds (a step interrupted
    /// between layers leaves the first ones ahead), and publishes the offset.
    pub fn give_back(self, store: &CallerCaches, mut caches: Vec<LayerCache>) {
        let held = caches.iter().map(LayerCache::offset).min().unwrap_or(0);
        for c in &mut caches {
            let extra = c.offset() - held;
            if c.trim(extra) != extra {
                // A rotating layer that cannot go back: the cache cannot be made whole.
                return self.lose();
            }
        }
        if !self.0.disposed.load(Ordering::Acquire) {
            store.borrow_mut().insert(self.0.id, caches);
            self.0.offset.store(held as u64, Ordering::Release);
        }
    }

    /// The layers are gone (a generation that failed inside a step): the cache starts empty.
    pub fn lose(self) {
        self.0.offset.store(0, Ordering::Release);
    }
}

impl Drop for CacheLease {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// Writes the cache `lease` holds (of `model`) to `path`; the cache keeps its layers.
pub fn save(lease: CacheLease, store: &CallerCaches, model: &dyn LanguageModel, path: &Path) -> Result<()> {
    let Some(layers) = lease.take(store) else {
        return file::save(path, model.fingerprint(), &model.new_cache());
    };
    let saved = file::save(path, model.fingerprint(), &layers);
    lease.give_back(store, layers);
    saved
}

/// Fills the cache `lease` holds with the one saved at `path`, checked to be `model`'s.
pub fn load(lease: CacheLease, store: &CallerCaches, model: &dyn LanguageModel, path: &Path) -> Result<()> {
    let template = model.new_cache();
    let shapes = model.cache_shapes();
    let expected = Expected { model: model.fingerprint(), template: &template, shapes: &shapes };
    lease.give_back(store, file::load(path, &expected)?);
    Ok(())
}
