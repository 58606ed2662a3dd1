//! KV caches.
mod kv;

pub use kv::KvCache;
