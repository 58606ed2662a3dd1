//! Tensor sources: safetensors folders (single file or sharded) and GGUF files. Opening parses and
//! validates headers only, touching no MLX; `array()` makes an MLX array on the engine thread.
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use mlx_rs::{Array, Dtype};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::mlx::host::array_from_bytes;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
    U8,
    I32,
}

impl DType {
    pub fn mlx(self) -> Dtype {
        match self {
            DType::F32 => Dtype::Float32,
            DType::F16 => Dtype::Float16,
            DType::BF16 => Dtype::Bfloat16,
            DType::U32 => Dtype::Uint32,
            DType::U8 => Dtype::Uint8,
            DType::I32 => Dtype::Int32,
        }
    }

    pub fn from_mlx(d: Dtype) -> Option<Self> {
        Some(match d {
            Dtype::Float32 => DType::F32,
            Dtype::Float16 => DType::F16,
            Dtype::Bfloat16 => DType::BF16,
            Dtype::Uint32 => DType::U32,
            Dtype::Uint8 => DType::U8,
            Dtype::Int32 => DType::I32,
            _ => return None,
        })
    }

    fn from_safetensors(d: safetensors::Dtype) -> Option<Self> {
        use safetensors::Dtype as S;
        Some(match d {
            S::F32 => DType::F32,
            S::F16 => DType::F16,
            S::BF16 => DType::BF16,
            S::U32 => DType::U32,
            S::U8 => DType::U8,
            S::I32 => DType::I32,
            _ => return None,
        })
    }

    pub fn safetensors(self) -> safetensors::Dtype {
        use safetensors::Dtype as S;
        match self {
            DType::F32 => S::F32,
            DType::F16 => S::F16,
            DType::BF16 => S::BF16,
            DType::U32 => S::U32,
            DType::U8 => S::U8,
            DType::I32 => S::I32,
        }
    }
}

/// Where a tensor's bytes live: a span of a memory-mapped file, or a buffer made at open time
/// (GGUF blocks repacked into MLX's layout).
#[derive(Clone)]
enum Bytes {
    Mapped { file: Arc<Mmap>, start: usize, end: usize },
    Owned(Arc<Vec<u8>>),
}

#[derive(Clone)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    bytes: Bytes,
}

impl Tensor {
    pub fn owned(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        Tensor { dtype, shape, bytes: Bytes::Owned(Arc::new(bytes)) }
    }

    /// Drops the file pages behind a mapped tensor once MLX holds its own copy, so loading does
    /// not keep the whole file resident beside the copies (peak RSS). A later read faults them
    /// back in from the file.
    fn release_pages(&self) {
        #[cfg(unix)]
        if let Bytes::Mapped { file, start, end } = &self.bytes {
            // SAFETY: the map is a read-only private file mapping: MADV_DONTNEED drops its pages
            // and a later access reads the same bytes from the file again, so no live borrow sees
            // different contents.
            let _ = unsafe { file.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, *start, end - start) };
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { file, start, end } => &file[*start..*end],
            Bytes::Owned(v) => v,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    Safetensors,
    Gguf,
}

/// Which dense matrices are held transposed in f32 for their matmuls (`layers::Dense::F32T`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum F32Matmuls {
    /// Every matrix as stored, as mlx-lm multiplies them. The transposed f32 layout is faster
    /// through OpenBLAS on some CPUs, but whether it rounds exactly like the stored one depends on
    /// the kernels OpenBLAS picks for the CPU at hand (bit for bit on one AMD EPYC, not on AVX-512
    /// machines), so no default may rely on it.
    #[default]
    Auto,
    /// Every matrix as stored (the same as `Auto` today).
    None,
    /// Every dense matrix held transposed in f32, and quantized matrices' half-precision scales
    /// and biases held in f32: faster on the CPU backend (dense bf16/f16 several times, at twice
    /// their memory; quantized ones 1.3-1.6x at one more bit per weight, `layers::QuantWeight`), but
    /// outputs round differently from MLX's half-precision kernels (and, on some CPUs, from the
    /// stored f32 layout), which can change tokens.
    All,
    /// As `All`, and where our kernel's int8 form runs, products with 4- and 8-bit matrices round
    /// each 32 values of x to 8 bits and sum with integer dot products
    /// (`kernels::AffineForm::Int8`, llama.cpp's way): faster again, x's rounding to 8 bits
    /// changes the numbers more (the eval instrument measures it).
    Int8,
}

impl F32Matmuls {
    /// Whether dense matrices are held transposed in f32 and quantized products run in f32
    /// (`All` and `Int8`).
    pub fn in_f32(self) -> bool {
        matches!(self, F32Matmuls::All | F32Matmuls::Int8)
    }
}

impl std::str::FromStr for F32Matmuls {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(F32Matmuls::Auto),
            "none" => Ok(F32Matmuls::None),
            "all" => Ok(F32Matmuls::All),
            "int8" => Ok(F32Matmuls::Int8),
            _ => Err(Error::option("f32Matmuls", format!("{s:?} is not one of \"auto\", \"all\", \"int8\", \"none\""))),
        }
    }
}

#[derive(Clone)]
pub struct Weights {
    pub path: PathBuf,
    pub format: WeightFormat,
    tensors: BTreeMap<String, Tensor>,
    /// Which dense matrices are built transposed in f32 (see `layers::Dense`).
    f32_matmuls: F32Matmuls,
}

impl Weights {
    pub fn from_tensors(path: PathBuf, format: WeightFormat, tensors: BTreeMap<String, Tensor>) -> Self {
        Weights { path, format, tensors, f32_matmuls: F32Matmuls::Auto }
    }

    /// Opens every `*.safetensors` file of a model folder (one file or a sharded set).
    pub fn open_dir(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::ModelNotFound(dir.to_path_buf()));
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::weights(dir, "no *.safetensors files"));
        }
        let mut tensors = BTreeMap::new();
        for path in &files {
            read_safetensors(path, &mut tensors)?;
        }
        check_shard_index(dir, &tensors)?;
        Ok(Weights { path: dir.to_path_buf(), format: WeightFormat::Safetensors, tensors, f32_matmuls: F32Matmuls::Auto })
    }

    /// The same tensors, building dense matrices as `f32_matmuls` says.
    pub fn with_f32_matmuls(mut self, f32_matmuls: F32Matmuls) -> Self {
        self.f32_matmuls = f32_matmuls;
        self
    }

    pub fn f32_matmuls(&self) -> F32Matmuls {
        self.f32_matmuls
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Where a text model's tensors are, and its output projection: `model.*` (a text-only
    /// checkpoint), `language_model.model.*` (a multimodal one as mlx-lm and mlx-vlm save it) or
    /// `model.language_model.*` (as Gemma 4 and Qwen3.5 are published).
    pub fn text_roots(&self) -> (&'static str, &'static str) {
        [("language_model.model", "language_model.lm_head"), ("model.language_model", "lm_head")]
            .into_iter()
            .find(|(root, _)| self.has(&format!("{root}.embed_tokens.weight")))
            .unwrap_or(("model", "lm_head"))
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes().len()).sum()
    }

    /// A new MLX array holding a copy of tensor `name`. Call on the engine thread only.
    pub fn array(&self, name: &str) -> Result<Array> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::tensor(name, format!("missing from {}", self.path.display())))?;
        let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
        let array = array_from_bytes(name, t.bytes(), &shape, t.dtype.mlx())?;
        t.release_pages();
        Ok(array)
    }

    /// Like `array`, checking the shape first so a mismatch names the tensor.
    pub fn array_shaped(&self, name: &str, shape: &[usize]) -> Result<Array> {
        if let Some(t) = self.tensors.get(name) {
            if t.shape != shape {
                return Err(Error::tensor(name, format!("expected shape {shape:?}, found {:?}", t.shape)));
            }
        }
        self.array(name)
    }
}

fn read_safetensors(path: &Path, out: &mut BTreeMap<String, Tensor>) -> Result<()> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: model files are not expected to change while mapped; a concurrent writer could only
    // corrupt the tensor values, which are copied into MLX before use.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?);
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map[..]).map_err(|e| {
        let reason = match declared_size(&map) {
            Some(want) if want > map.len() => format!("truncated: the header describes {want} bytes but the file has {}", map.len()),
            _ => format!("not a valid safetensors file ({e})"),
        };
        Error::weights(path, reason)
    })?;
    let base = 8 + header_len;
    for (name, info) in meta.tensors() {
        let dtype = DType::from_safetensors(info.dtype)
            .ok_or_else(|| Error::tensor(&name, format!("unsupported dtype {:?}", info.dtype)))?;
        let (start, end) = (base + info.data_offsets.0, base + info.data_offsets.1);
        if end > map.len() {
            return Err(Error::weights(
                path,
                format!("truncated: tensor {name} ends at byte {end} but the file has {} bytes", map.len()),
            ));
        }
        let tensor = Tensor { dtype, shape: info.shape.clone(), bytes: Bytes::Mapped { file: map.clone(), start, end } };
        out.insert(name, tensor);
    }
    Ok(())
}

/// The file size a safetensors header promises, if the header itself is readable.
fn declared_size(bytes: &[u8]) -> Option<usize> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let header: serde_json::Value = serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let end = header
        .as_object()?
        .values()
        .filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    Some(8 + n + end as usize)
}

/// A sharded folder's index names every tensor and its file; a missing shard must not pass as a
/// smaller model.
fn check_shard_index(dir: &Path, tensors: &BTreeMap<String, Tensor>) -> Result<()> {
    let index = dir.join("model.safetensors.index.json");
    let Ok(text) = std::fs::read_to_string(&index) else { return Ok(()) };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::weights(&index, e.to_string()))?;
    let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(Error::weights(&index, "no weight_map"));
    };
    for (name, file) in map {
        if !tensors.contains_key(name) {
            return Err(Error::weights(
                &index,
                format!("tensor {name} is listed in {} but missing", file.as_str().unwrap_or("?")),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_st(path: &Path, tensors: &[(&str, DType, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), safetensors::tensor::TensorView::new(d.safetensors(), s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn opens_sharded_folder_and_checks_index() {
        let dir = tempdir("shards");
        write_st(&dir.join("model-00001-of-00002.safetensors"), &[("a", DType::F32, vec![2], vec![0; 8])]);
        write_st(&dir.join("model-00002-of-00002.safetensors"), &[("b", DType::BF16, vec![2, 2], vec![0; 8])]);
        let w = Weights::open_dir(&dir).unwrap();
        assert_eq!(w.names().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(w.get("b").unwrap().shape, vec![2, 2]);
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "c": "model-00003-of-00003.safetensors"}}"#,
        )
        .unwrap();
        let e = Weights::open_dir(&dir).err().unwrap();
        assert!(e.to_string().contains("tensor c"), "{e}");
    }

    #[test]
    fn truncated_file_is_a_typed_error() {
        let dir = tempdir("trunc");
        let p = dir.join("model.safetensors");
        write_st(&p, &[("w", DType::F32, vec![64], vec![1; 256])]);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
        let e = Weights::open_dir(&dir).err().unwrap();
        assert_eq!(e.code(), "INVALID_WEIGHTS");
        std::fs::write(&p, b"garbage").unwrap();
        assert_eq!(Weights::open_dir(&dir).err().unwrap().code(), "INVALID_WEIGHTS");
        assert_eq!(Weights::open_dir(&dir.join("nope")).err().unwrap().code(), "MODEL_NOT_FOUND");
    }

    pub(crate) fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mlx-bun-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
