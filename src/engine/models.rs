//! The models the engine thread holds, by id: the registry every session's request names.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::error::{Error, Result};
use crate::model::LanguageModel;

pub type ModelId = u64;
pub type Models = Rc<RefCell<HashMap<ModelId, ModelSlot>>>;

/// A model the engine thread was asked to load. Its id exists from the moment `createModel`
/// returns; the load runs as a task, ahead of any work on the model (commands are handled in
/// order, and the thread's tasks run before the engines' sessions).
pub enum ModelSlot {
    Loading,
    Ready(Rc<dyn LanguageModel>),
    /// Every use fails with the load's error.
    Failed(Error),
}

/// The loaded model `id`, or `None` while its load is still queued: a session may reach the
/// thread before its model's load task has run (another task was ahead of it), and then waits.
/// The load's error if it failed; `MODEL_DISPOSED` once unloaded.
pub fn when_loaded(models: &Models, id: ModelId) -> Result<Option<Rc<dyn LanguageModel>>> {
    match models.borrow().get(&id) {
        Some(ModelSlot::Loading) => Ok(None),
        _ => lookup(models, id).map(Some),
    }
}

/// The loaded model `id`; the load's error if it failed; `MODEL_DISPOSED` once unloaded.
pub fn lookup(models: &Models, id: ModelId) -> Result<Rc<dyn LanguageModel>> {
    match models.borrow().get(&id) {
        Some(ModelSlot::Ready(m)) => Ok(m.clone()),
        Some(ModelSlot::Failed(e)) => Err(e.replicate()),
        Some(ModelSlot::Loading) => Err(Error::Internal(format!("model {id} was used before its load ran"))),
        None => Err(Error::ModelDisposed),
    }
}

