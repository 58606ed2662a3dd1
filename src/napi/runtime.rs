//! `ensureNativeRuntime`'s native half: what the loaded MLX runtime runs on, asked on the engine
//! thread (MLX work belongs there; a device query from the JS thread would start MLX's streams
//! on it).
use napi_derive::napi;

use super::js_error;
use crate::engine::EngineThread;
use crate::error::Error;
use crate::mlx::backend;

#[napi(object)]
pub struct RuntimeInfo {
    pub backend: String,
    pub device: String,
    pub version: String,
}

#[napi]
pub async fn runtime_info_native() -> napi::Result<RuntimeInfo> {
    let r = EngineThread::get().run(|| Ok(backend::runtime())).await.map_err(|_| js_error(Error::EngineDead))?.map_err(js_error)?;
    Ok(RuntimeInfo { backend: r.backend.to_owned(), device: r.device, version: r.version })
}
