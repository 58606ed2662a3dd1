//! `fit`, `thisMachine` and `skuMatrix` for JavaScript: mlx-bun's object shapes ↔ `crate::fit`.
//! The config, machine and KV scheme arrive as JSON (index.js has checked their keys); every
//! number is checked by the core, which names the one at fault.
use napi_derive::napi;
use serde_json::Value;

use super::js_error;
use crate::fit::{self, FitReport, KvScheme, Machine, MachineSpec, Request, Text};

/// mlx-bun's `FitReport`.
#[napi(object)]
pub struct FitReportJs {
    pub fits: bool,
    pub context_tokens: f64,
    pub weights_bytes: f64,
    pub kv_bytes: f64,
    pub transient_bytes: f64,
    pub total_bytes: f64,
    pub usable_bytes: f64,
    pub max_safe_context: f64,
    pub predicted_decode_tps: f64,
}

impl From<FitReport> for FitReportJs {
    fn from(r: FitReport) -> Self {
        FitReportJs {
            fits: r.fits,
            context_tokens: r.context_tokens,
            weights_bytes: r.weights_bytes,
            kv_bytes: r.kv_bytes,
            transient_bytes: r.transient_bytes,
            total_bytes: r.total_bytes,
            usable_bytes: r.usable_bytes,
            max_safe_context: r.max_safe_context,
            predicted_decode_tps: r.predicted_decode_tps,
        }
    }
}

/// mlx-bun's `MachineSpec`, with the chip and where its bandwidth figure comes from.
#[napi(object)]
pub struct MachineSpecJs {
    pub name: String,
    pub ram_bytes: f64,
    #[napi(js_name = "bandwidthGBs")]
    pub bandwidth_gbs: f64,
    pub chip: Option<String>,
    /// `'table' | 'given' | 'estimated'`
    pub bandwidth_source: String,
}

impl From<MachineSpec> for MachineSpecJs {
    fn from(m: MachineSpec) -> Self {
        MachineSpecJs { name: m.name, ram_bytes: m.ram_bytes, bandwidth_gbs: m.bandwidth_gbs, chip: m.chip, bandwidth_source: m.bandwidth_source.as_str().into() }
    }
}

/// One row of mlx-bun's `skuMatrix`.
#[napi(object)]
pub struct SkuRowJs {
    pub sku: String,
    #[napi(js_name = "ramGB")]
    pub ram_gb: u32,
    pub fits: bool,
    pub max_context: f64,
    pub decode_tps: f64,
}

fn scheme(kv: Option<Value>, text: &Text) -> crate::error::Result<KvScheme> {
    kv.map_or(Ok(KvScheme::default()), |v| KvScheme::from_json(&v, text.num_hidden_layers))
}

/// `fit(config.text, weightsBytes, ctx, machine?, chunk?, expertsBytes?, usableBytes?, kvScheme?)`.
#[allow(clippy::too_many_arguments)]
#[napi(catch_unwind)]
pub fn fit_native(
    text: Value,
    weights_bytes: f64,
    ctx: f64,
    machine: Option<Value>,
    chunk: Option<f64>,
    experts_bytes: Option<f64>,
    usable_bytes: Option<f64>,
    kv_scheme: Option<Value>,
) -> napi::Result<FitReportJs> {
    let run = || {
        let text = Text::from_json(&text)?;
        let machine = match machine {
            Some(m) => Machine::from_json(&m)?,
            None => fit::this_machine(None)?.machine(),
        };
        let kv = scheme(kv_scheme, &text)?;
        let request = Request {
            text: &text,
            weights_bytes,
            ctx,
            machine,
            chunk: chunk.unwrap_or(fit::DEFAULT_CHUNK),
            experts_bytes: experts_bytes.unwrap_or(0.0),
            usable_bytes,
            kv: &kv,
        };
        fit::fit(&request)
    };
    run().map(FitReportJs::from).map_err(js_error)
}

/// `thisMachine(bandwidthGBs?)`.
#[napi(catch_unwind)]
pub fn this_machine_native(bandwidth_gbs: Option<f64>) -> napi::Result<MachineSpecJs> {
    fit::this_machine(bandwidth_gbs).map(MachineSpecJs::from).map_err(js_error)
}

/// `skuMatrix(config.text, weightsBytes, ctx, expertsBytes?, kvScheme?)`.
#[napi(catch_unwind)]
pub fn sku_matrix_native(text: Value, weights_bytes: f64, ctx: f64, experts_bytes: Option<f64>, kv_scheme: Option<Value>) -> napi::Result<Vec<SkuRowJs>> {
    let run = || {
        let text = Text::from_json(&text)?;
        let kv = scheme(kv_scheme, &text)?;
        fit::sku_matrix(&text, weights_bytes, ctx, experts_bytes.unwrap_or(0.0), &kv)
    };
    let rows = run().map_err(js_error)?;
    Ok(rows.into_iter().map(|r| SkuRowJs { sku: r.sku.into(), ram_gb: r.ram_gb, fits: r.fits, max_context: r.max_context, decode_tps: r.decode_tps }).collect())
}
