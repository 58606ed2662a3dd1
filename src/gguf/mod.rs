//! Reader for GGUF v2/v3 files (llama.cpp's single-file model format).
//!
//! The whole file is memory-mapped: metadata is parsed eagerly (it is small), tensor data stays
//! in the map and is handed out as byte slices, so opening a multi-gigabyte file is cheap. Every
//! length and count read from the file is checked against the bytes actually left before anything
//! is allocated, because a corrupt or hostile header must produce an error, not an abort.
//!
//! Used by both the model loader (tensors, `model::gguf_weights`) and the tokenizer (the vocabulary
//! and chat template live in the metadata); `quants` holds ggml's block formats.
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, Result};

pub mod affine;
pub mod quants;
#[cfg(test)]
pub(crate) mod tests;

pub use quants::GgmlType;

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

    /// Arrays of booleans.
    pub fn get_bool_array(&self, key: &str) -> Option<Vec<bool>> {
        self.array(key)?.iter().map(|v| if let Value::Bool(b) = v { Some(*b) } else { None }).collect()
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
