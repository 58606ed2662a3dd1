//! `mlx-bun fit MODEL`: will the model fit this machine, how long a context is safe, and how fast
//! it should decode (`crate::fit`, the same numbers as `fit()` and `GET /fit`).
use std::path::Path;

use clap::Args;
use indicatif::HumanBytes;
use serde_json::json;

use super::hub::registry;
use crate::error::{Error, Result};
use crate::fit::{this_machine, KvScheme, ModelFit};
use crate::hub::registry::{self as index, Filter};

#[derive(Args)]
pub struct FitArgs {
    /// A model folder or .gguf file, or a repo id or fragment of a model on disk (`mlx-bun ls`).
    model: String,
    /// Context tokens to assess.
    #[arg(long, default_value_t = 8192)]
    ctx: u64,
    /// Bill an affine-quantized KV cache of this many bits (2, 3, 4, 5, 6 or 8; group 64).
    #[arg(long)]
    kv_bits: Option<u32>,
    /// Also assess every Apple Silicon chip and RAM size.
    #[arg(long)]
    skus: bool,
    /// Print one JSON object: {model, path, machine, kvBits, report, skuMatrix?}.
    #[arg(long)]
    json: bool,
}

/// 8192 → "8,192".
fn grouped(n: f64) -> String {
    let digits = format!("{n:.0}");
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 && c.is_ascii_digit() {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn bytes(b: f64) -> String {
    format!("{:>11}", HumanBytes(b.max(0.0) as u64).to_string())
}

pub fn fit(a: FitArgs) -> Result<()> {
    let kv = KvScheme::bits(a.kv_bits)?;
    let record = match index::record(Path::new(&a.model)) {
        Some(r) => r,
        None => {
            let reg = registry();
            if reg.list(&Filter::default()).is_empty() {
                reg.scan(None)?;
            }
            reg.resolve(&a.model)?
        }
    };
    let model = ModelFit::from_record(&record)?;
    let spec = this_machine(None)?;
    let ctx = a.ctx as f64;
    let r = model.report(ctx, spec.machine(), &kv)?;
    let skus = if a.skus { Some(model.sku_matrix(ctx, &kv)?) } else { None };
    if a.json {
        let mut out = json!({"model": record.repo_id, "path": record.path, "machine": spec, "kvBits": a.kv_bits, "report": r});
        if let Some(rows) = &skus {
            out["skuMatrix"] = json!(rows);
        }
        println!("{}", serde_json::to_string_pretty(&out).map_err(|e| Error::Internal(e.to_string()))?);
        return Ok(());
    }
    let chip = spec.chip.as_deref().unwrap_or("unknown CPU");
    println!("will it fit?");
    println!("  {} @ {} context{}", record.repo_id, grouped(ctx), a.kv_bits.map_or(String::new(), |b| format!(", {b}-bit KV cache")));
    println!(
        "  this machine: {chip}, {} RAM, {} GB/s ({})",
        HumanBytes(spec.ram_bytes as u64),
        spec.bandwidth_gbs,
        spec.bandwidth_source.as_str()
    );
    println!();
    if model.experts_bytes > 0.0 {
        println!("  weights    {}  (experts {})", bytes(r.weights_bytes), HumanBytes(model.experts_bytes as u64));
    } else {
        println!("  weights    {}", bytes(r.weights_bytes));
    }
    println!("  kv cache   {}", bytes(r.kv_bytes));
    println!("  transient  {}", bytes(r.transient_bytes));
    println!("  total      {}  of {} usable  {}", bytes(r.total_bytes), HumanBytes(r.usable_bytes as u64), if r.fits { "FITS" } else { "DOES NOT FIT" });
    println!();
    println!("  max safe context   {} tokens", grouped(r.max_safe_context));
    println!("  predicted decode   {:.1} tok/s", r.predicted_decode_tps);
    if let Some(rows) = skus {
        println!();
        println!("  {:<9} {:>7}  {:<5} {:>12} {:>12}", "chip", "ram", "fits", "max context", "decode");
        for row in rows {
            let (fits, max, decode) = if row.fits {
                ("fits", grouped(row.max_context), format!("~{:.0} tok/s", row.decode_tps))
            } else {
                ("-", "-".into(), "-".into())
            };
            println!("  {:<9} {:>4} GB  {:<5} {:>12} {:>12}", row.sku, row.ram_gb, fits, max, decode);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_are_grouped() {
        assert_eq!(super::grouped(0.0), "0");
        assert_eq!(super::grouped(999.0), "999");
        assert_eq!(super::grouped(8192.0), "8,192");
        assert_eq!(super::grouped(1_048_576.0), "1,048,576");
    }
}
