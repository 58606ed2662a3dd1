//! The dump reader against dumps our writer makes, and against every way one can be damaged.
use super::*;

const VOCAB: usize = 100;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("mlx-bun-dump-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn manifest(ctx_len: u64, n_seqs: u64, top_k: u64) -> Manifest {
    Manifest {
        format_version: FORMAT_VERSION,
        model: "test".into(),
        corpus_sha256: String::new(),
        ctx_len,
        n_seqs,
        top_k,
        positions_per_seq: ctx_len - 1,
        created: rfc3339(0),
        notes: String::new(),
        vocab_size: Some(VOCAB as u64),
    }
}

/// A dump of 2 sequences of 5 tokens, top-3: position r of sequence s lists ids 10s+r, +1, +2
/// with logits 2, 1, 0.5 and logsumexp 3 + r.
fn write(dir: &Path) -> Manifest {
    let windows: Vec<Vec<u32>> = (0..2).map(|s| (0..5).map(|t| 7 * s + t).collect()).collect();
    let refs: Vec<&[u32]> = windows.iter().map(Vec::as_slice).collect();
    let w = DumpWriter::create(dir, manifest(5, 2, 3), &refs).unwrap();
    for s in 0..2u32 {
        let mut seq = w.seq(s as usize).unwrap();
        for r in 0..4u32 {
            let id = 10 * s + r;
            seq.push(&[id, id + 1, id + 2], &[2.0, 1.0, 0.5], 3.0 + r as f32).unwrap();
        }
        seq.finish().unwrap();
    }
    w.finish().unwrap()
}

fn code(dir: &Path) -> String {
    match Dump::open(dir).and_then(|d| {
        d.check_vocab(VOCAB)?;
        d.tokens(1, VOCAB)?;
        d.records(1, VOCAB)?.read(4)
    }) {
        Ok(_) => "OK".into(),
        Err(e) => format!("{}: {e}", e.code()),
    }
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

/// Byte offset of position `r`'s record in a sequence file of top-3 records.
fn at(r: usize) -> usize {
    r * (3 * 6 + 4)
}

#[test]
fn what_the_writer_writes_the_reader_reads_back() {
    let d = TempDir::new("roundtrip");
    let m = write(&d.0);
    let dump = Dump::open(&d.0).unwrap();
    assert_eq!(dump.manifest, m);
    assert_eq!(m.record_bytes(), 22);
    assert_eq!(std::fs::metadata(d.0.join("seq-1.bin")).unwrap().len(), 4 * 22);
    assert_eq!(dump.tokens(1, VOCAB).unwrap(), vec![7, 8, 9, 10, 11]);
    let mut seq = dump.records(1, VOCAB).unwrap();
    let first = seq.read(1).unwrap();
    assert_eq!(first, Records { ids: vec![10, 11, 12], logits: vec![2.0, 1.0, 0.5], lse: vec![3.0] });
    let rest = seq.read(3).unwrap();
    assert_eq!(rest.ids, vec![11, 12, 13, 12, 13, 14, 13, 14, 15]);
    assert_eq!(rest.lse, vec![4.0, 5.0, 6.0]);
    // The manifest holds mlx-bun's fields, and the vocabulary.
    let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(d.0.join("manifest.json")).unwrap()).unwrap();
    let keys: Vec<&str> = raw.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["format_version", "model", "corpus_sha256", "ctx_len", "n_seqs", "top_k", "positions_per_seq", "created", "notes", "vocab_size"]);
}

#[test]
fn the_seeds_manifest_without_a_vocabulary_is_read() {
    let d = TempDir::new("novocab");
    write(&d.0);
    edit_manifest(&d.0, |v| {
        v.as_object_mut().unwrap().remove("vocab_size");
    });
    assert_eq!(code(&d.0), "OK");
}

#[test]
fn damaged_manifests_are_invalid_dumps() {
    let cases: Vec<(&str, Box<dyn Fn(&mut serde_json::Value)>)> = vec![
        ("format_version", Box::new(|v| v["format_version"] = 2.into())),
        ("ctx_len", Box::new(|v| v["ctx_len"] = 6.into())),
        ("positions_per_seq", Box::new(|v| v["positions_per_seq"] = 5.into())),
        ("tokens.bin: 40 bytes where the manifest implies 60", Box::new(|v| v["n_seqs"] = 3.into())),
        ("seq-0.bin: 88 bytes where the manifest implies 112", Box::new(|v| v["top_k"] = 4.into())),
        // Absurd numbers are refused before any size is computed from them.
        ("outside", Box::new(|v| v["top_k"] = 1_000_000_000_000u64.into())),
        ("outside", Box::new(|v| v["n_seqs"] = 0.into())),
        ("invalid", Box::new(|v| v["ctx_len"] = (-5).into())),
        ("invalid", Box::new(|v| v["ctx_len"] = 1e12.into())),
        ("missing field", Box::new(|v| {
            v.as_object_mut().unwrap().remove("top_k");
        })),
        ("vocabulary", Box::new(|v| v["vocab_size"] = 99.into())),
    ];
    for (want, edit) in cases {
        let d = TempDir::new("manifest");
        write(&d.0);
        edit_manifest(&d.0, edit);
        let got = code(&d.0);
        assert!(got.starts_with("INVALID_LOGITS_DUMP") && got.contains(want), "{want}: {got}");
    }
    let d = TempDir::new("nomanifest");
    write(&d.0);
    std::fs::write(d.0.join("manifest.json"), "not json").unwrap();
    assert!(code(&d.0).starts_with("INVALID_LOGITS_DUMP"));
    std::fs::remove_file(d.0.join("manifest.json")).unwrap();
    assert!(code(&d.0).starts_with("INVALID_LOGITS_DUMP"));
}

#[test]
fn short_long_or_missing_files_are_invalid_dumps() {
    for (file, len) in [("tokens.bin", 39u64), ("tokens.bin", 41), ("seq-1.bin", 87), ("seq-0.bin", 0)] {
        let d = TempDir::new("size");
        write(&d.0);
        std::fs::OpenOptions::new().write(true).open(d.0.join(file)).unwrap().set_len(len).unwrap();
        let got = code(&d.0);
        assert!(got.starts_with("INVALID_LOGITS_DUMP") && got.contains(file) && got.contains("manifest implies"), "{file} {len}: {got}");
    }
    let d = TempDir::new("missing");
    write(&d.0);
    std::fs::remove_file(d.0.join("seq-1.bin")).unwrap();
    assert!(code(&d.0).starts_with("INVALID_LOGITS_DUMP"));
}

#[test]
fn bad_ids_logits_and_logsumexps_are_invalid_dumps() {
    let patch = |file: &str, offset: usize, bytes: &[u8], want: &str| {
        let d = TempDir::new("records");
        write(&d.0);
        let p = d.0.join(file);
        let mut raw = std::fs::read(&p).unwrap();
        raw[offset..offset + bytes.len()].copy_from_slice(bytes);
        std::fs::write(&p, raw).unwrap();
        let got = code(&d.0);
        assert!(got.starts_with("INVALID_LOGITS_DUMP") && got.contains(want), "{want}: {got}");
    };
    // A token or listed id outside the candidate's vocabulary: a dump of another model.
    patch("tokens.bin", 5 * 4 + 8, &100i32.to_le_bytes(), "token 2: id 100 is outside");
    patch("tokens.bin", 5 * 4, &(-1i32).to_le_bytes(), "id -1 is outside");
    patch("seq-1.bin", at(2) + 4, &(VOCAB as i32).to_le_bytes(), "position 2: id 100 is outside");
    patch("seq-1.bin", at(3) + 8, &13i32.to_le_bytes(), "position 3: id 13 is listed twice");
    // Logits (after the 3 ids): out of order, not finite; then the logsumexp.
    patch("seq-1.bin", at(1) + 12 + 2, &f16::from_f32(2.5).to_le_bytes(), "position 1: logits are not in descending order");
    patch("seq-1.bin", at(0) + 12, &f16::NAN.to_le_bytes(), "position 0: logit NaN");
    patch("seq-1.bin", at(0) + 12, &f16::NEG_INFINITY.to_le_bytes(), "logit -inf");
    patch("seq-1.bin", at(3) + 18, &f32::INFINITY.to_le_bytes(), "position 3: logsumexp inf");
}

/// Reads all of a dump as `eval kl` would.
fn read_all(dir: &Path) -> Result<()> {
    let dump = Dump::open(dir)?;
    dump.check_vocab(VOCAB)?;
    for s in 0..dump.manifest.n_seqs as usize {
        dump.tokens(s, VOCAB)?;
        dump.records(s, VOCAB)?.read(dump.manifest.positions_per_seq as usize)?;
    }
    Ok(())
}

#[test]
fn random_damage_is_an_invalid_dump_or_readable_never_a_panic() {
    let d = TempDir::new("random");
    write(&d.0);
    let files = ["manifest.json", "tokens.bin", "seq-0.bin", "seq-1.bin"];
    let originals: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(d.0.join(f)).unwrap()).collect();
    // xorshift64: the same damage on every run.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as usize
    };
    let mut refused = 0;
    for _ in 0..600 {
        let i = next() % files.len();
        let mut bytes = originals[i].clone();
        for _ in 0..1 + next() % 4 {
            let at = next() % bytes.len();
            bytes[at] = next() as u8;
        }
        if next() % 4 == 0 {
            bytes.truncate(next() % bytes.len());
        }
        std::fs::write(d.0.join(files[i]), &bytes).unwrap();
        if let Err(e) = read_all(&d.0) {
            assert_eq!(e.code(), "INVALID_LOGITS_DUMP", "{e}");
            refused += 1;
        }
        std::fs::write(d.0.join(files[i]), &originals[i]).unwrap();
    }
    assert!(refused > 300, "only {refused} of 600 damaged dumps refused");
}

#[test]
fn a_top_k_above_the_candidates_vocabulary_is_refused() {
    let d = TempDir::new("topk");
    write(&d.0);
    let dump = Dump::open(&d.0).unwrap();
    assert!(dump.check_vocab(VOCAB).is_ok());
    let e = dump.check_vocab(2).map(|_| ()).unwrap_err();
    assert_eq!(e.code(), "INVALID_LOGITS_DUMP");
}

#[test]
fn created_is_an_rfc3339_utc_time() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_796_268_225), "2026-12-03T03:23:45Z");
    assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
}
