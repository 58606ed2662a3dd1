//! `GET /fit`: mlx-bun's fit assessment of the served model on this machine (`crate::fit`, the
//! same function as `mlx-bun fit` and `fit()` in JavaScript), at 8192 tokens unless `?ctx=N`,
//! with an affine-quantized KV cache when `?kvBits=B`; plus the Apple SKU matrix at 32 768
//! tokens. The body keeps mlx-bun's field names.
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::Json;
use serde_json::{json, Value};

use super::app::App;
use super::error::ApiError;
use crate::fit::{json_number, this_machine, FitReport, KvScheme};

/// The context reported when the request names none (and mlx-bun's "typical" context).
pub const DEFAULT_CONTEXT: u64 = 8192;
/// mlx-bun's SKU matrix context.
const SKU_MATRIX_CONTEXT: f64 = 32_768.0;

fn report_json(r: &FitReport) -> Value {
    let n = json_number;
    json!({
        "fits": r.fits,
        "weights_bytes": n(r.weights_bytes),
        "kv_bytes": n(r.kv_bytes),
        "transient_bytes": n(r.transient_bytes),
        "total_bytes": n(r.total_bytes),
        "usable_bytes": n(r.usable_bytes),
        "max_safe_context": n(r.max_safe_context),
        "predicted_decode_tps": n(r.predicted_decode_tps),
    })
}

fn number<T: std::str::FromStr>(query: &BTreeMap<String, String>, key: &str, what: &str) -> Result<Option<T>, ApiError> {
    query.get(key).map(|v| v.parse::<T>().map_err(|_| ApiError::param(key, format!("must be {what}, got '{v}'")))).transpose()
}

pub async fn fit(State(app): State<Arc<App>>, Query(query): Query<BTreeMap<String, String>>) -> Result<Json<Value>, ApiError> {
    if let Some(other) = query.keys().find(|k| !["ctx", "kvBits"].contains(&k.as_str())) {
        return Err(ApiError::param(other, "unknown query parameter (this endpoint takes ctx and kvBits)"));
    }
    let ctx = number::<u64>(&query, "ctx", "a number of tokens")?.unwrap_or(DEFAULT_CONTEXT) as f64;
    let kv_bits = number::<u32>(&query, "kvBits", "2, 3, 4, 5, 6 or 8")?;
    let kv = KvScheme::bits(kv_bits)?;
    let model = &app.ctx.fit;
    let spec = this_machine(None)?;
    let report = model.report(ctx, spec.machine(), &kv)?;
    let typical = ctx.min(DEFAULT_CONTEXT as f64);
    let matrix: Vec<Value> = model
        .sku_matrix(SKU_MATRIX_CONTEXT, &kv)?
        .iter()
        .map(|r| json!({"sku": r.sku, "ram_gb": r.ram_gb, "fits": r.fits, "max_context": json_number(r.max_context), "decode_tps": r.decode_tps}))
        .collect();
    Ok(Json(json!({
        "model": app.ctx.id,
        "machine": {
            "chip": spec.chip,
            "ram_bytes": json_number(spec.ram_bytes),
            "bandwidth_gbs": json_number(spec.bandwidth_gbs),
            "bandwidth_source": spec.bandwidth_source.as_str(),
        },
        "context_tokens": json_number(ctx),
        "kv_bits": kv_bits,
        "typical_context_tokens": json_number(typical),
        "typical_decode_tps": json_number(model.report(typical, spec.machine(), &kv)?.predicted_decode_tps),
        // mlx-bun fills these from its evaluation database; this engine keeps none.
        "measured_decode_tps": null,
        "measured_at": null,
        "report": report_json(&report),
        "sku_matrix_ctx": json_number(SKU_MATRIX_CONTEXT),
        "sku_matrix": matrix,
    })))
}
