//! A saved KV cache (`loadKvCache`) from any bytes: a real file (a plain, a rotating and a
//! recurrent layer, as Qwen3.5's linear-attention layers save theirs) with its bytes overwritten and cut (mode 0), or with every number and name of its header
//! replaced by ones from the input (mode 1), so the checks of offsets, lengths, shapes and kinds
//! are reached, not only the JSON parser. Errors are fine; a panic, a hang or a huge allocation
//! is a bug. A cache that loads must step on.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mlx_bun::cache::file::{load, save, Expected, LayerShape};
use mlx_bun::cache::{KvCache, LayerCache, RecurrentCache, RotatingKvCache};
use mlx_rs::Array;

fn template() -> Vec<LayerCache> {
    vec![
        LayerCache::Plain(KvCache::default()),
        LayerCache::Rotating(RotatingKvCache::new(4, 0)),
        LayerCache::Recurrent(RecurrentCache::default()),
    ]
}

const SHAPES: [LayerShape; 3] = [
    LayerShape::Kv { kv_heads: 2, head_dim: 4 },
    LayerShape::Kv { kv_heads: 2, head_dim: 4 },
    LayerShape::Recurrent { conv: [3, 8], state: [2, 2, 4] },
];

/// One step of `n` positions on every layer: keys and values, or a new convolution input and state.
fn step(caches: &mut [LayerCache], seed: f32) -> mlx_bun::error::Result<()> {
    for c in caches {
        match c {
            LayerCache::Recurrent(r) => {
                r.set(Array::from_slice(&[seed; 24], &[1, 3, 8]), Array::from_slice(&[-seed; 16], &[1, 2, 2, 4]), 1);
                mlx_rs::transforms::eval(r.state())?;
            }
            c => {
                let (k, _) = c.update_and_fetch(kv(seed), kv(-seed))?;
                mlx_rs::transforms::eval(k.parts())?;
            }
        }
    }
    Ok(())
}

fn kv(seed: f32) -> Array {
    Array::from_slice(&[seed; 8], &[1, 2, 1, 4])
}

fn dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-bun-fuzz-kv-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A real file: six positions, so the rotating layer has wrapped.
fn seed() -> &'static [u8] {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(|| {
        let mut caches = template();
        for i in 0..6 {
            step(&mut caches, i as f32).unwrap();
        }
        let p = dir().join("seed.kv");
        save(&p, "m1", &caches).unwrap();
        std::fs::read(p).unwrap()
    })
}

/// Every number and string of `v` replaced in turn by ones drawn from `data`.
fn replace(v: &mut serde_json::Value, data: &mut impl Iterator<Item = u8>) {
    use serde_json::Value;
    let mut next = |n: usize| -> Option<u64> { (0..n).map(|_| data.next()).try_fold(0u64, |a, b| Some((a << 8) | u64::from(b?))) };
    match v {
        Value::Number(_) => {
            if let Some(tag) = next(1) {
                *v = match tag % 4 {
                    0 => Value::from(next(1).unwrap_or(0)),
                    1 => Value::from(next(2).unwrap_or(0)),
                    2 => Value::from(next(8).unwrap_or(0)),
                    _ => return,
                };
            }
        }
        Value::String(s) => {
            const NAMES: [&str; 9] = ["plain", "rotating", "recurrent", "float32", "bfloat16", "int32", "m1", "m2", ""];
            if let Some(tag) = next(1) {
                if tag < 64 {
                    *s = NAMES[tag as usize % NAMES.len()].into();
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| replace(x, data)),
        Value::Object(o) => o.values_mut().for_each(|x| replace(x, data)),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let seed = seed();
    let Some((&mode, rest)) = data.split_first() else { return };
    let file = if mode % 2 == 0 {
        let mut f = seed.to_vec();
        let (cut, edits) = rest.split_at(rest.len().min(2));
        for e in edits.chunks(3).filter(|e| e.len() == 3) {
            let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % f.len();
            f[at] = e[2];
        }
        if let [a, b] = *cut {
            f.truncate(usize::from(u16::from_le_bytes([a, b])).max(1).min(f.len()));
        }
        f
    } else {
        let n = u32::from_le_bytes(seed[12..16].try_into().unwrap()) as usize;
        let mut header: serde_json::Value = serde_json::from_slice(&seed[16..16 + n]).unwrap();
        replace(&mut header, &mut rest.iter().copied());
        let json = serde_json::to_vec(&header).unwrap();
        if json.len() > n {
            return;
        }
        // The same length as the seed's header (padded with spaces), so the data stays in place.
        let mut f = seed.to_vec();
        f[16..16 + json.len()].copy_from_slice(&json);
        f[16 + json.len()..16 + n].fill(b' ');
        f
    };
    let p = dir().join("input.kv");
    std::fs::write(&p, &file).unwrap();
    let t = template();
    if let Ok(mut caches) = load(&p, &Expected { model: "m1", template: &t, shapes: &SHAPES }) {
        let _ = step(&mut caches, 9.0);
    }
});
