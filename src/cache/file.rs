//! A conversation's KV cache saved to a file and restored later (`saveKvCache` / `loadKvCache`),
//! so a chat app picks a conversation up after a restart without prefilling it again.
//!
//! Layout: the magic `MLXBUNKV`, a little-endian u32 version and a u32 header length, a JSON
//! header, then each layer's keys and values (a linear-attention layer's convolution inputs and
//! recurrent state) as raw little-endian tensors, every tensor starting on a 4 KiB page so the file can be mapped and read in place. The header names the model it was
//! saved from (a fingerprint of its weights), the positions held and each layer's kind. Nothing
//! in the file is trusted: every number is checked against the file's length and the model's
//! shapes before anything is read or allocated. Hand-written because no maintained format fits:
//! safetensors cannot page-align its tensors or carry per-layer cache state.
use std::io::Write;
use std::path::Path;

use memmap2::Mmap;
use mlx_rs::{Array, Dtype};
use serde::{Deserialize, Serialize};

use super::{KvCache, LayerCache, RecurrentCache, RotatingKvCache};
use crate::error::{Error, Result};
use crate::mlx::host::{array_from_bytes, dtype_size, to_bytes};

const MAGIC: &[u8; 8] = b"MLXBUNKV";
pub const VERSION: u32 = 1;
const PAGE: u64 = 4096;
/// Headers are a few hundred bytes per layer; anything larger is not one of ours.
const MAX_HEADER: u64 = 1 << 24;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Header {
    model: String,
    positions: u64,
    layers: Vec<Layer>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Layer {
    kind: Kind,
    /// Positions the layer has seen (a rotating one holds only the last of them).
    offset: u64,
    /// Keys and values, absent while the layer holds nothing.
    keys: Option<Tensor>,
    values: Option<Tensor>,
    /// A recurrent layer's convolution inputs and state, absent before its first position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    conv: Option<Tensor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<Tensor>,
}

#[derive(Serialize, Deserialize, PartialEq, Eq, Clone, Copy, Debug)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Plain,
    Rotating,
    Recurrent,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Tensor {
    dtype: String,
    shape: Vec<u64>,
    start: u64,
    bytes: u64,
}

/// What a model's caches look like: `template` is a fresh set of its layer caches (their kinds
/// and windows), `shapes` what each of them holds.
pub struct Expected<'a> {
    pub model: &'a str,
    pub template: &'a [LayerCache],
    pub shapes: &'a [LayerShape],
}

/// What one layer's cache holds (layers of one model differ: Gemma 4's full and sliding layers,
/// Qwen3.5's linear and full ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerShape {
    /// Keys and values [1, kv_heads, positions, head_dim].
    Kv { kv_heads: usize, head_dim: usize },
    /// Convolution inputs [1, kernel - 1, channels] and state [1, heads, value_dim, key_dim].
    Recurrent { conv: [usize; 2], state: [usize; 3] },
}

fn dtype_name(d: Dtype) -> Result<&'static str> {
    match d {
        Dtype::Float32 => Ok("float32"),
        Dtype::Bfloat16 => Ok("bfloat16"),
        Dtype::Float16 => Ok("float16"),
        other => Err(Error::Internal(format!("a KV cache of {other:?}"))),
    }
}

fn dtype_of(name: &str) -> Option<Dtype> {
    match name {
        "float32" => Some(Dtype::Float32),
        "bfloat16" => Some(Dtype::Bfloat16),
        "float16" => Some(Dtype::Float16),
        _ => None,
    }
}

/// The positions one layer holds, as the file keeps them: keys and values, or a recurrent
/// layer's convolution inputs and state.
fn layer_contents(c: &LayerCache) -> Result<(Kind, Option<(Array, Array)>)> {
    let kv = match c {
        LayerCache::Plain(c) => c.contents(),
        LayerCache::Rotating(c) => c.ordered()?,
        LayerCache::Recurrent(r) => return Ok((Kind::Recurrent, r.get_part(0).zip(r.get_part(1)).map(|(c, s)| (c.clone(), s.clone())))),
    };
    let plain = match &kv {
        None => None,
        Some((k, v)) => match (k.plain(), v.plain()) {
            (Some(k), Some(v)) => Some((k.clone(), v.clone())),
            // The file format has no fields for packed words, scales and biases.
            _ => return Err(Error::UnsupportedOption { option: "kvBits".into(), reason: "quantized KV caches cannot be saved to a file yet".into() }),
        },
    };
    Ok((kind(c)?, plain))
}

fn kind(c: &LayerCache) -> Result<Kind> {
    match c {
        LayerCache::Plain(_) => Ok(Kind::Plain),
        LayerCache::Rotating(_) => Ok(Kind::Rotating),
        LayerCache::Recurrent(_) => Ok(Kind::Recurrent),
    }
}

/// Writes `caches` (all at one offset) of the model fingerprinted `model` to `path`.
pub fn save(path: &Path, model: &str, caches: &[LayerCache]) -> Result<()> {
    let positions = caches.first().map_or(0, LayerCache::offset);
    if caches.iter().any(|c| c.offset() != positions) {
        return Err(Error::Internal("a cache whose layers hold different positions".into()));
    }
    let mut layers = Vec::with_capacity(caches.len());
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut next = 0u64;
    let mut place = |a: &Array, data: &mut Vec<Vec<u8>>| -> Result<Tensor> {
        let bytes = to_bytes(a)?;
        let s = a.shape();
        let t = Tensor {
            dtype: dtype_name(a.dtype())?.into(),
            shape: s.iter().map(|&d| d as u64).collect(),
            start: next,
            bytes: bytes.len() as u64,
        };
        next = (next + t.bytes).div_ceil(PAGE) * PAGE;
        data.push(bytes);
        Ok(t)
    };
    for c in caches {
        let (kind, kv) = layer_contents(c)?;
        let (a, b) = match kv {
            Some((k, v)) => (Some(place(&k, &mut data)?), Some(place(&v, &mut data)?)),
            None => (None, None),
        };
        let offset = c.offset() as u64;
        layers.push(match kind {
            Kind::Recurrent => Layer { kind, offset, keys: None, values: None, conv: a, state: b },
            _ => Layer { kind, offset, keys: a, values: b, conv: None, state: None },
        });
    }
    let mut header = Header { model: model.into(), positions: positions as u64, layers };
    // Tensors start after the header, on a page; the header holds their starts, so its length
    // depends on where the data begins: move the data a page on until the header fits before it.
    let relative: Vec<u64> = tensors(&header).map(|t| t.start).collect();
    let mut base = 0;
    let json = loop {
        for (t, r) in tensors_mut(&mut header).zip(&relative) {
            t.start = base + r;
        }
        let json = serde_json::to_vec(&header).map_err(|e| Error::Internal(e.to_string()))?;
        let room = (16 + json.len() as u64).div_ceil(PAGE) * PAGE;
        if room <= base {
            break json;
        }
        base = room;
    };
    write(path, &json, &header, &data)
}

/// Every tensor, in the order their data is written.
fn tensors(h: &Header) -> impl Iterator<Item = &Tensor> {
    h.layers.iter().flat_map(|l| l.keys.iter().chain(&l.values).chain(&l.conv).chain(&l.state))
}

fn tensors_mut(h: &mut Header) -> impl Iterator<Item = &mut Tensor> {
    h.layers.iter_mut().flat_map(|l| l.keys.iter_mut().chain(&mut l.values).chain(&mut l.conv).chain(&mut l.state))
}

/// Writes to a temporary file first, so an interrupted save never leaves a damaged file behind.
fn write(path: &Path, json: &[u8], header: &Header, data: &[Vec<u8>]) -> Result<()> {
    let tmp = path.with_extension("partial");
    let io = |e| Error::io(path, e);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    f.write_all(MAGIC).map_err(io)?;
    f.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    f.write_all(&(json.len() as u32).to_le_bytes()).map_err(io)?;
    f.write_all(json).map_err(io)?;
    let mut at = 16 + json.len() as u64;
    for (t, bytes) in tensors(header).zip(data) {
        f.write_all(&vec![0u8; (t.start - at) as usize]).map_err(io)?;
        f.write_all(bytes).map_err(io)?;
        at = t.start + bytes.len() as u64;
    }
    f.flush().map_err(io)?;
    f.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Reads a cache saved by `save`, checked against what `expected` says the model's caches are.
pub fn load(path: &Path, expected: &Expected) -> Result<Vec<LayerCache>> {
    let bad = |reason: String| Error::InvalidCacheFile { path: path.to_path_buf(), reason };
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: a read-only map of a file that is only read while the map lives; the arrays copy
    // what they need before it is dropped.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let len = map.len() as u64;
    if len < 16 || &map[..8] != MAGIC {
        return Err(bad("not a saved KV cache".into()));
    }
    let version = u32::from_le_bytes(map[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(bad(format!("a KV cache of format version {version}; this build reads version {VERSION}")));
    }
    let header_len = u64::from(u32::from_le_bytes(map[12..16].try_into().expect("4 bytes")));
    if header_len > MAX_HEADER || 16 + header_len > len {
        return Err(bad(format!("a header of {header_len} bytes in a file of {len}: the file is truncated or damaged")));
    }
    let header: Header =
        serde_json::from_slice(&map[16..(16 + header_len) as usize]).map_err(|e| bad(format!("damaged header: {e}")))?;
    if header.model != expected.model {
        return Err(bad("was saved from another model".into()));
    }
    // Positions become i32 offsets (RoPE, masks): a count no cache can hold is damage.
    if header.positions > i32::MAX as u64 / 2 {
        return Err(bad(format!("claims {} positions: damaged", header.positions)));
    }
    if header.layers.len() != expected.template.len() || expected.shapes.len() != expected.template.len() {
        return Err(bad(format!("has {} layers; the model has {}", header.layers.len(), expected.template.len())));
    }
    // A tensor of the shape `dims` says (`None`: a count of positions, 1 to i32::MAX).
    let read = |t: &Tensor, what: &str, dims: &[Option<usize>]| -> Result<Array> {
        let dtype = dtype_of(&t.dtype).ok_or_else(|| bad(format!("{what}: unknown dtype '{}'", t.dtype)))?;
        let fits = t.shape.len() == dims.len()
            && t.shape.iter().zip(dims).all(|(&n, d)| match d {
                Some(d) => n == *d as u64,
                None => (1..=i32::MAX as u64).contains(&n),
            });
        if !fits {
            let want: Vec<String> = dims.iter().map(|d| d.map_or("positions".into(), |d| d.to_string())).collect();
            return Err(bad(format!("{what}: shape {:?}, the model's are [{}]", t.shape, want.join(", "))));
        }
        let need = t.shape.iter().try_fold(dtype_size(dtype) as u64, |n, &d| n.checked_mul(d));
        let end = t.start.checked_add(t.bytes);
        match (need, end) {
            (Some(need), Some(end)) if need == t.bytes && t.start % PAGE == 0 && t.start >= 16 + header_len && end <= len => {}
            _ => return Err(bad(format!("{what}: {} bytes at {} do not hold its shape within the file's {len}: truncated or damaged", t.bytes, t.start))),
        }
        let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
        array_from_bytes(what, &map[t.start as usize..(t.start + t.bytes) as usize], &shape, dtype)
    };
    let mut caches = Vec::with_capacity(header.layers.len());
    for (i, ((layer, like), shape)) in header.layers.iter().zip(expected.template).zip(expected.shapes).enumerate() {
        if layer.offset != header.positions {
            return Err(bad(format!("layer {i} holds {} positions, the cache {}", layer.offset, header.positions)));
        }
        let kind = kind(like)?;
        if layer.kind != kind {
            return Err(bad(format!("layer {i} is {:?}; the model's is {kind:?}", layer.kind)));
        }
        if let (LayerCache::Recurrent(_), LayerShape::Recurrent { conv, state }) = (like, shape) {
            let parts = match (&layer.conv, &layer.state, &layer.keys, &layer.values) {
                (Some(c), Some(s), None, None) if layer.offset > 0 => {
                    let c = read(c, &format!("layer {i} convolution inputs"), &[Some(1), Some(conv[0]), Some(conv[1])])?;
                    Some((c, read(s, &format!("layer {i} state"), &[Some(1), Some(state[0]), Some(state[1]), Some(state[2])])?))
                }
                (None, None, None, None) if layer.offset == 0 => None,
                _ => return Err(bad(format!("layer {i}: its state does not match its {} positions", layer.offset))),
            };
            caches.push(LayerCache::Recurrent(RecurrentCache::restored(parts, layer.offset as usize)));
            continue;
        }
        let (kv_heads, head_dim) = match shape {
            LayerShape::Kv { kv_heads, head_dim } => (*kv_heads, *head_dim),
            LayerShape::Recurrent { .. } => return Err(Error::Internal(format!("layer {i}: a recurrent shape for a KV cache"))),
        };
        let dims = [Some(1), Some(kv_heads), None, Some(head_dim)];
        let kv = match (&layer.keys, &layer.values, &layer.conv, &layer.state) {
            (Some(k), Some(v), None, None) => {
                let (k, v) = (read(k, &format!("layer {i} keys"), &dims)?, read(v, &format!("layer {i} values"), &dims)?);
                if k.shape() != v.shape() || k.dtype() != v.dtype() {
                    return Err(bad(format!("layer {i}: keys and values differ in shape or dtype")));
                }
                Some((k, v))
            }
            (None, None, None, None) if layer.offset == 0 => None,
            _ => return Err(bad(format!("layer {i}: its keys and values do not match its {} positions", layer.offset))),
        };
        let held = kv.as_ref().map_or(0, |(k, _)| k.shape()[2] as u64);
        caches.push(match (like, kv) {
            (LayerCache::Plain(_), None) => LayerCache::Plain(KvCache::default()),
            (LayerCache::Plain(_), Some((k, v))) if held == layer.offset => LayerCache::Plain(KvCache::from_contents(k, v)),
            (LayerCache::Rotating(r), None) => LayerCache::Rotating(RotatingKvCache::new(r.max_size(), r.keep())),
            // A rotating layer holds every position it saw, or (once wrapped) at least a window.
            (LayerCache::Rotating(r), Some((k, v))) if held == layer.offset || (held < layer.offset && held >= r.max_size() as u64) => {
                LayerCache::Rotating(RotatingKvCache::from_ordered(r.max_size(), r.keep(), k, v, layer.offset as usize))
            }
            _ => return Err(bad(format!("layer {i} holds {held} of its {} positions", layer.offset))),
        });
    }
    mlx_rs::transforms::eval(caches.iter().flat_map(LayerCache::state))?;
    Ok(caches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::host::to_f32_vec;
    use mlx_rs::ops;

    fn kv(len: i32, seed: f32) -> Array {
        let n = (2 * len * 4) as usize;
        let v: Vec<f32> = (0..n).map(|i| seed + i as f32 * 0.25).collect();
        Array::from_slice(&v, &[1, 2, len, 4])
    }

    /// A plain layer and a rotating layer (window 4) that have both seen `n` positions.
    fn caches(n: i32) -> Vec<LayerCache> {
        let mut plain = LayerCache::Plain(KvCache::default());
        let mut rotating = LayerCache::Rotating(RotatingKvCache::new(4, 0));
        for i in 0..n {
            plain.update_and_fetch(kv(1, i as f32), kv(1, -(i as f32))).unwrap();
            rotating.update_and_fetch(kv(1, i as f32), kv(1, -(i as f32))).unwrap();
        }
        caches_eval(&plain, &rotating);
        vec![plain, rotating]
    }

    fn caches_eval(a: &LayerCache, b: &LayerCache) {
        mlx_rs::transforms::eval(a.state().into_iter().chain(b.state())).unwrap();
    }

    const SHAPES: [LayerShape; 2] = [LayerShape::Kv { kv_heads: 2, head_dim: 4 }; 2];

    fn template() -> Vec<LayerCache> {
        vec![LayerCache::Plain(KvCache::default()), LayerCache::Rotating(RotatingKvCache::new(4, 0))]
    }

    fn expected(t: &[LayerCache]) -> Expected<'_> {
        Expected { model: "m1", template: t, shapes: &SHAPES[..t.len().min(2)] }
    }

    /// Each layer's positions, in temporal order, as host floats.
    fn held(c: &[LayerCache]) -> Vec<Vec<f32>> {
        c.iter().map(|c| layer_contents(c).unwrap().1.map_or(vec![], |(k, v)| [to_f32_vec(&k).unwrap(), to_f32_vec(&v).unwrap()].concat())).collect()
    }

    fn path(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("mlx-bun-kv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn round_trips_plain_and_rotating_layers_page_aligned() {
        let t = template();
        for n in [0, 3, 9] {
            let before = caches(n);
            let p = path(&format!("rt{n}.kv"));
            save(&p, "m1", &before).unwrap();
            let mut after = load(&p, &expected(&t)).unwrap();
            assert_eq!(held(&after), held(&before), "{n} positions");
            assert_eq!(after.iter().map(LayerCache::offset).collect::<Vec<_>>(), [n as usize; 2]);
            let bytes = std::fs::read(&p).unwrap();
            let header: Header = serde_json::from_slice(&bytes[16..16 + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize]).unwrap();
            assert!(tensors(&header).all(|t| t.start % PAGE == 0));
            // A restored cache goes on as the original does.
            let mut before = before;
            for c in before.iter_mut().chain(after.iter_mut()) {
                c.update_and_fetch(kv(1, 100.0), kv(1, 200.0)).unwrap();
            }
            assert_eq!(held(&after), held(&before), "{n} positions, one more");
        }
    }

    #[test]
    fn recurrent_layers_round_trip_and_are_checked_against_their_shapes() {
        let mut r = RecurrentCache::default();
        let conv = ops::arange::<_, f32>(0, 24, 1).unwrap().reshape(&[1, 3, 8]).unwrap();
        let state = ops::arange::<_, f32>(0, 16, 1).unwrap().reshape(&[1, 2, 2, 4]).unwrap();
        r.set(conv, state, 5);
        let mut plain = KvCache::default();
        for i in 0..5 {
            plain.update_and_fetch(kv(1, i as f32), kv(1, 0.0)).unwrap();
        }
        let caches = vec![LayerCache::Recurrent(r), LayerCache::Plain(plain)];
        let p = path("recurrent.kv");
        save(&p, "m1", &caches).unwrap();
        let t = vec![LayerCache::Recurrent(RecurrentCache::default()), LayerCache::Plain(KvCache::default())];
        let shapes = [LayerShape::Recurrent { conv: [3, 8], state: [2, 2, 4] }, LayerShape::Kv { kv_heads: 2, head_dim: 4 }];
        let back = load(&p, &Expected { model: "m1", template: &t, shapes: &shapes }).unwrap();
        assert_eq!(held(&back), held(&caches));
        assert_eq!(back[0].offset(), 5);
        let wrong = [LayerShape::Recurrent { conv: [3, 8], state: [2, 4, 2] }, shapes[1]];
        let e = load(&p, &Expected { model: "m1", template: &t, shapes: &wrong }).map(|_| ()).unwrap_err();
        assert_eq!(e.code(), "INVALID_CACHE_FILE", "{e}");
    }

    #[test]
    fn damaged_foreign_and_other_version_files_are_typed_errors() {
        let t = template();
        let p = path("good.kv");
        save(&p, "m1", &caches(6)).unwrap();
        let good = std::fs::read(&p).unwrap();
        let code = |bytes: &[u8]| {
            let q = path("bad.kv");
            std::fs::write(&q, bytes).unwrap();
            load(&q, &expected(&t)).map(|_| ()).unwrap_err()
        };
        // Every truncation, and garbage.
        for cut in (0..good.len()).step_by(97).chain([good.len() - 1]) {
            assert_eq!(code(&good[..cut]).code(), "INVALID_CACHE_FILE", "cut at {cut}");
        }
        assert_eq!(code(b"not a cache at all, just text").code(), "INVALID_CACHE_FILE");
        let mut other = good.clone();
        other[8..12].copy_from_slice(&2u32.to_le_bytes());
        let e = code(&other);
        assert!(e.to_string().contains("version 2"), "{e}");
        let mut huge = good.clone();
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(code(&huge).code(), "INVALID_CACHE_FILE");
        // Another model, another layout, another shape.
        let e = load(&p, &Expected { model: "m2", ..expected(&t) }).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("another model"), "{e}");
        let swapped = vec![t[1].clone(), t[0].clone()];
        assert_eq!(load(&p, &expected(&swapped)).map(|_| ()).unwrap_err().code(), "INVALID_CACHE_FILE");
        assert_eq!(load(&p, &expected(&t[..1])).map(|_| ()).unwrap_err().code(), "INVALID_CACHE_FILE");
        let three = [LayerShape::Kv { kv_heads: 3, head_dim: 4 }; 2];
        assert_eq!(load(&p, &Expected { shapes: &three, ..expected(&t) }).map(|_| ()).unwrap_err().code(), "INVALID_CACHE_FILE");
        // Numbers in the header that point outside the file or overflow.
        let n = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
        let text = String::from_utf8(good[16..16 + n].to_vec()).unwrap();
        // The good file with another header (its data moved with it: starts then point elsewhere).
        let with_header = |edited: &str| {
            let mut bytes = good[..16].to_vec();
            bytes[12..16].copy_from_slice(&(edited.len() as u32).to_le_bytes());
            bytes.extend(edited.as_bytes());
            bytes.extend(&good[16 + n..]);
            bytes
        };
        for (from, to) in [("\"positions\":6", "\"positions\":7"), ("\"bytes\":", "\"bytes\":1"), ("\"start\":", "\"start\":18446744073709551"), ("[1,2,6,4]", "[1,2,4294967296,4]")] {
            let edited = text.replacen(from, to, 1);
            assert_ne!(edited, text, "{from}");
            assert_eq!(code(&with_header(&edited)).code(), "INVALID_CACHE_FILE", "{to}");
        }
        let e = code(&with_header(&text.replacen("\"positions\":6", "\"positions\":4294967296", 1)));
        assert!(e.to_string().contains("claims 4294967296 positions"), "{e}");
        assert_eq!(load(&path("absent.kv"), &expected(&t)).map(|_| ()).unwrap_err().code(), "IO_ERROR");
    }
}
