//! The format-1 teacher-logits dump of mlx-bun's eval README: what a reference model (mlx-lm in
//! scripts/mlx_lm_eval.py, or `mlx-bun eval dump`) saw at every teacher-forced position, so that
//! candidates are scored against it without the reference being resident.
//!
//! ```text
//! manifest.json  {format_version: 1, model, corpus_sha256, ctx_len, n_seqs, top_k,
//!                 positions_per_seq, created, notes, vocab_size?}
//! tokens.bin     int32 LE [n_seqs][ctx_len]
//! seq-<i>.bin    per position r = 0..ctx_len-2 (the distribution over token r+1):
//!                int32[top_k] ids by descending logit, float16[top_k] logits,
//!                float32 full-vocab logsumexp
//! ```
//!
//! A dump is untrusted input: every number of the manifest is bounded before a size is computed
//! from it, every file's length is checked against those sizes before it is read, sequences are
//! read a chunk of positions at a time, and every id, logit and logsumexp is checked as it is
//! read. Anything else is `INVALID_LOGITS_DUMP`, naming the file.
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use half::f16;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub const FORMAT_VERSION: u64 = 1;

/// Far above any real dump (a window of a million tokens, a million windows, a top-k the size of
/// the largest vocabularies) and far below what could overflow the size arithmetic.
const MAX_CTX_LEN: u64 = 1 << 20;
const MAX_SEQS: u64 = 1 << 20;
const MAX_TOP_K: u64 = 1 << 20;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Manifest {
    pub format_version: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub corpus_sha256: String,
    pub ctx_len: u64,
    pub n_seqs: u64,
    pub top_k: u64,
    pub positions_per_seq: u64,
    #[serde(default)]
    pub created: String,
    #[serde(default)]
    pub notes: String,
    /// Not in mlx-bun's manifest: our writers add the reference's vocabulary so that a candidate
    /// of another one is refused before any forward. Dumps without it are checked id by id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<u64>,
}

fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidDump { path: path.to_path_buf(), reason: reason.into() }
}

impl Manifest {
    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| Err(invalid(path, reason));
        if self.format_version != FORMAT_VERSION {
            return bad(format!("format_version {} (this reader knows {FORMAT_VERSION})", self.format_version));
        }
        for (name, value, max) in [("ctx_len", self.ctx_len, MAX_CTX_LEN), ("n_seqs", self.n_seqs, MAX_SEQS), ("top_k", self.top_k, MAX_TOP_K)] {
            if value == 0 || value > max {
                return bad(format!("{name} {value} is outside 1..={max}"));
            }
        }
        if self.ctx_len < 2 {
            return bad("ctx_len 1 has no position to score".into());
        }
        if self.positions_per_seq != self.ctx_len - 1 {
            return bad(format!("positions_per_seq {} is not ctx_len - 1 = {}", self.positions_per_seq, self.ctx_len - 1));
        }
        Ok(())
    }

    /// Bytes of one position's record.
    pub fn record_bytes(&self) -> u64 {
        self.top_k * (4 + 2) + 4
    }
}

/// A dump whose manifest and file sizes have been checked.
pub struct Dump {
    dir: PathBuf,
    pub manifest: Manifest,
}

impl Dump {
    pub fn open(dir: &Path) -> Result<Dump> {
        let path = dir.join("manifest.json");
        let text = std::fs::read(&path).map_err(|e| invalid(&path, format!("cannot read: {e}")))?;
        let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| invalid(&path, e.to_string()))?;
        manifest.validate(&path)?;
        // The bounds above keep these products far from overflowing.
        expect_len(&dir.join("tokens.bin"), manifest.n_seqs * manifest.ctx_len * 4)?;
        let seq_bytes = manifest.positions_per_seq * manifest.record_bytes();
        for i in 0..manifest.n_seqs {
            expect_len(&dir.join(format!("seq-{i}.bin")), seq_bytes)?;
        }
        Ok(Dump { dir: dir.to_path_buf(), manifest })
    }

    /// Refuses a candidate whose vocabulary cannot be the reference's.
    pub fn check_vocab(&self, vocab: usize) -> Result<()> {
        let path = self.dir.join("manifest.json");
        if let Some(v) = self.manifest.vocab_size.filter(|&v| v != vocab as u64) {
            return Err(invalid(&path, format!("the reference's vocabulary has {v} tokens, the candidate's {vocab}")));
        }
        if self.manifest.top_k > vocab as u64 {
            return Err(invalid(&path, format!("top_k {} exceeds the candidate's vocabulary of {vocab}", self.manifest.top_k)));
        }
        Ok(())
    }

    /// Sequence `seq`'s tokens, each checked to be inside a vocabulary of `vocab`.
    pub fn tokens(&self, seq: usize, vocab: usize) -> Result<Vec<u32>> {
        let path = self.dir.join("tokens.bin");
        let ctx = self.manifest.ctx_len as usize;
        let mut file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        file.seek(SeekFrom::Start((seq * ctx * 4) as u64)).map_err(|e| Error::io(&path, e))?;
        let mut raw = vec![0u8; ctx * 4];
        file.read_exact(&mut raw).map_err(|e| invalid(&path, format!("sequence {seq}: {e}")))?;
        raw.chunks_exact(4)
            .enumerate()
            .map(|(i, b)| {
                let id = i32::from_le_bytes(b.try_into().expect("4 bytes"));
                u32::try_from(id).ok().filter(|&id| (id as usize) < vocab).ok_or_else(|| {
                    invalid(&path, format!("sequence {seq}, token {i}: id {id} is outside the candidate's vocabulary of {vocab} (a dump of another model?)"))
                })
            })
            .collect()
    }

    /// Sequence `seq`'s records, read in order.
    pub fn records(&self, seq: usize, vocab: usize) -> Result<SeqReader> {
        let path = self.dir.join(format!("seq-{seq}.bin"));
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        Ok(SeqReader { file: BufReader::new(file), path, top_k: self.manifest.top_k as usize, vocab, done: 0, seen: vec![usize::MAX; vocab] })
    }
}

fn expect_len(path: &Path, bytes: u64) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| invalid(path, format!("cannot read: {e}")))?;
    if meta.len() != bytes {
        return Err(invalid(path, format!("{} bytes where the manifest implies {bytes}", meta.len())));
    }
    Ok(())
}

/// Consecutive positions of one sequence: `ids` and `logits` [n][top_k], `lse` [n].
#[derive(Debug, Default, PartialEq)]
pub struct Records {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub lse: Vec<f32>,
}

pub struct SeqReader {
    file: BufReader<File>,
    path: PathBuf,
    top_k: usize,
    vocab: usize,
    /// Positions read so far.
    done: usize,
    /// The last position each id appeared at, to find an id listed twice in one record.
    seen: Vec<usize>,
}

impl SeqReader {
    /// The next `n` positions (the file's length was checked when the dump was opened).
    pub fn read(&mut self, n: usize) -> Result<Records> {
        let k = self.top_k;
        let mut out = Records { ids: Vec::with_capacity(n * k), logits: Vec::with_capacity(n * k), lse: Vec::with_capacity(n) };
        let mut raw = vec![0u8; k * 6 + 4];
        for _ in 0..n {
            let pos = self.done;
            let bad = |reason: String| invalid(&self.path, format!("position {pos}: {reason}"));
            self.file.read_exact(&mut raw).map_err(|e| bad(e.to_string()))?;
            let (ids, rest) = raw.split_at(k * 4);
            let (logits, lse) = rest.split_at(k * 2);
            for (j, b) in ids.chunks_exact(4).enumerate() {
                let id = i32::from_le_bytes(b.try_into().expect("4 bytes"));
                let id = usize::try_from(id).ok().filter(|&id| id < self.vocab).ok_or_else(|| bad(format!("id {id} is outside the candidate's vocabulary of {}", self.vocab)))?;
                if self.seen[id] == pos {
                    return Err(bad(format!("id {id} is listed twice")));
                }
                self.seen[id] = pos;
                out.ids.push(id as u32);
                let logit = f16::from_le_bytes(logits[j * 2..j * 2 + 2].try_into().expect("2 bytes")).to_f32();
                if !logit.is_finite() {
                    return Err(bad(format!("logit {logit} of id {id}")));
                }
                if out.logits.len() % k > 0 && logit > out.logits[out.logits.len() - 1] {
                    return Err(bad("logits are not in descending order".into()));
                }
                out.logits.push(logit);
            }
            let lse = f32::from_le_bytes(lse.try_into().expect("4 bytes"));
            if !lse.is_finite() {
                return Err(bad(format!("logsumexp {lse}")));
            }
            out.lse.push(lse);
            self.done += 1;
        }
        Ok(out)
    }
}

/// Writes a dump: tokens first, the manifest last, so a dump cut short has no manifest.
pub struct DumpWriter {
    dir: PathBuf,
    manifest: Manifest,
}

impl DumpWriter {
    /// Starts a dump of `windows` (each `manifest.ctx_len` tokens) in `dir`, created if missing.
    pub fn create(dir: &Path, manifest: Manifest, windows: &[&[u32]]) -> Result<DumpWriter> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join("tokens.bin");
        let bytes: Vec<u8> = windows.iter().flat_map(|w| w.iter()).flat_map(|&t| (t as i32).to_le_bytes()).collect();
        std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
        Ok(DumpWriter { dir: dir.to_path_buf(), manifest })
    }

    pub fn seq(&self, i: usize) -> Result<SeqWriter> {
        let path = self.dir.join(format!("seq-{i}.bin"));
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        Ok(SeqWriter { file: BufWriter::new(file), path })
    }

    pub fn finish(self) -> Result<Manifest> {
        let path = self.dir.join("manifest.json");
        let text = serde_json::to_string_pretty(&self.manifest).map_err(|e| Error::Internal(e.to_string()))?;
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        Ok(self.manifest)
    }
}

pub struct SeqWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl SeqWriter {
    /// One position: its top-k `ids` by descending logit, their `logits` (stored as f16) and the
    /// full-vocabulary logsumexp.
    pub fn push(&mut self, ids: &[u32], logits: &[f32], lse: f32) -> Result<()> {
        let mut raw = Vec::with_capacity(ids.len() * 6 + 4);
        raw.extend(ids.iter().flat_map(|&id| (id as i32).to_le_bytes()));
        raw.extend(logits.iter().flat_map(|&l| f16::from_f32(l).to_le_bytes()));
        raw.extend(lse.to_le_bytes());
        self.file.write_all(&raw).map_err(|e| Error::io(&self.path, e))
    }

    pub fn finish(mut self) -> Result<()> {
        self.file.flush().map_err(|e| Error::io(&self.path, e))
    }
}

/// `secs` since the Unix epoch as an RFC 3339 UTC time (the manifest's `created`), by the
/// proleptic Gregorian calendar's 400-year cycle of 146097 days.
pub fn rfc3339(secs: u64) -> String {
    let (days, rem) = (secs / 86400, secs % 86400);
    // Days since 0000-03-01, so that a leap day ends its year.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
#[path = "dump_tests.rs"]
mod tests;
