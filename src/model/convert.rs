//! `mlx-bun convert`: writes any loadable model (folder or GGUF) as an HF/MLX folder that mlx-lm
//! loads: model.safetensors, config.json and the tokenizer files. Without options the tensors
//! are written as loaded (a GGUF's Q4/Q8 blocks stay MLX-quantized, losslessly); `dtype` casts
//! float tensors (dequantizing quantized ones), and `q_bits` quantizes every 2-D weight whose
//! rows divide into groups, like `mlx_lm convert -q`.
use std::collections::BTreeMap;
use std::path::Path;

use mlx_rs::{ops, Array};
use serde_json::{json, Value};

use super::config::{ModelConfig, QUANT_BITS, QUANT_GROUP_SIZES};
use super::weights::{DType, Tensor, Weights};
use crate::error::{Error, Result};
use crate::mlx::host;

#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    pub dtype: Option<DType>,
    pub q_bits: Option<i32>,
    pub q_group_size: Option<i32>,
}

impl ConvertOptions {
    pub fn validate(&self) -> Result<()> {
        if let Some(b) = self.q_bits {
            if !QUANT_BITS.contains(&b) {
                return Err(Error::option("qBits", format!("must be one of 2, 3, 4, 5, 6, 8; got {b}")));
            }
        }
        if let Some(g) = self.q_group_size {
            if !QUANT_GROUP_SIZES.contains(&g) {
                return Err(Error::option("qGroupSize", format!("must be 32, 64 or 128; got {g}")));
            }
        }
        if matches!(self.dtype, Some(d) if !matches!(d, DType::F32 | DType::F16 | DType::BF16)) {
            return Err(Error::option("dtype", "must be f32, f16 or bf16"));
        }
        Ok(())
    }
}

/// The converted tensors and the config.json to write with them; `on_tensor` is called as each
/// source tensor is taken up (for a progress bar). MLX work: engine thread only.
pub fn convert(w: &Weights, cfg: &ModelConfig, o: &ConvertOptions, on_tensor: &dyn Fn()) -> Result<(BTreeMap<String, Tensor>, Value)> {
    o.validate()?;
    let mut out = BTreeMap::new();
    let mut raw = cfg.raw.clone();
    let keep_quant = o.dtype.is_none() && o.q_bits.is_none();
    let group = o.q_group_size.unwrap_or(64);
    for name in w.names() {
        on_tensor();
        let base = name.strip_suffix(".weight");
        let quantized = base.is_some_and(|b| w.has(&format!("{b}.scales")));
        if keep_quant {
            out.insert(name.to_owned(), w.get(name).cloned().expect("listed tensor"));
            continue;
        }
        if name.ends_with(".scales") || name.ends_with(".biases") {
            continue;
        }
        let mut a = if quantized {
            let b = base.unwrap();
            let q = cfg
                .quantization
                .as_ref()
                .and_then(|q| q.params_for(b))
                .ok_or_else(|| Error::tensor(name, "quantized tensor without quantization parameters"))?;
            ops::dequantize(
                w.array(name)?,
                w.array(&format!("{b}.scales"))?,
                &w.array(&format!("{b}.biases"))?,
                q.group_size,
                q.bits,
            )?
        } else {
            w.array(name)?
        };
        if let Some(d) = o.dtype {
            a = a.as_dtype(d.mlx())?;
        }
        match (o.q_bits, base) {
            (Some(bits), Some(b)) if a.ndim() == 2 && a.shape()[1] % group == 0 => {
                let (qw, scales, biases) = ops::quantize(&a, group, bits)?;
                out.insert(name.to_owned(), tensor(&qw)?);
                out.insert(format!("{b}.scales"), tensor(&scales)?);
                out.insert(format!("{b}.biases"), tensor(&biases)?);
            }
            _ => {
                out.insert(name.to_owned(), tensor(&a)?);
            }
        }
    }
    let obj = raw.as_object_mut().ok_or_else(|| Error::config(&cfg.source, "config is not an object"))?;
    if !keep_quant {
        obj.remove("quantization");
        obj.remove("quantization_config");
        if let Some(bits) = o.q_bits {
            let q = json!({"group_size": group, "bits": bits, "mode": "affine"});
            obj.insert("quantization".into(), q.clone());
            obj.insert("quantization_config".into(), q);
        }
    }
    if let Some(d) = o.dtype {
        let name = match d {
            DType::F32 => "float32",
            DType::F16 => "float16",
            _ => "bfloat16",
        };
        obj.insert("torch_dtype".into(), json!(name));
    }
    Ok((out, raw))
}

fn tensor(a: &Array) -> Result<Tensor> {
    let dtype = DType::from_mlx(a.dtype()).ok_or_else(|| Error::Mlx(format!("unexpected dtype {:?}", a.dtype())))?;
    let shape = a.shape().iter().map(|&d| d as usize).collect();
    Ok(Tensor::owned(dtype, shape, host::to_bytes(a)?))
}

/// Writes `model.safetensors` (MLX metadata) and `config.json` into `out`.
pub fn write_weights(out: &Path, tensors: &BTreeMap<String, Tensor>, config: &Value) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let views = tensors
        .iter()
        .map(|(n, t)| {
            safetensors::tensor::TensorView::new(t.dtype.safetensors(), t.shape.clone(), t.bytes())
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::tensor(n, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "mlx".to_string())]);
    let path = out.join("model.safetensors");
    safetensors::serialize_to_file(views, Some(meta), &path).map_err(|e| Error::weights(&path, e.to_string()))?;
    let cfg_path = out.join("config.json");
    let text = serde_json::to_string_pretty(config).map_err(|e| Error::config(&cfg_path, e.to_string()))?;
    std::fs::write(&cfg_path, text).map_err(|e| Error::io(&cfg_path, e))
}
