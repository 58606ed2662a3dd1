//! Any bytes as a model folder's model.safetensors: header length, JSON header, offsets, dtypes,
//! shapes; every tensor the open reports is read. Errors are fine; a panic is a bug.
#![no_main]
use libfuzzer_sys::fuzz_target;
use mlx_bun::model::weights::Weights;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("mlx-bun-fuzz-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), data).unwrap();
    let Ok(w) = Weights::open_dir(&dir) else { return };
    let names: Vec<String> = w.names().map(str::to_owned).collect();
    for name in names {
        if let Some(t) = w.get(&name) {
            std::hint::black_box(t.bytes().len());
        }
    }
});
