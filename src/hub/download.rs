//! `downloadModel`: a repository from the Hugging Face hub's HTTP file API into the hub cache, laid
//! out as huggingface_hub lays it out so Python tools and the registry see the same files:
//! `blobs/<sha256 or git blob id>` (verified bytes), `snapshots/<commit>/<file>` (relative
//! symlinks to the blobs) and `refs/<revision>` (the commit).
//!
//! Every file is checked against the listing before it is kept: its size, and its SHA-256 (LFS
//! files) or git blob SHA-1 (small files). A file being fetched lives in
//! `blobs/<id>.incomplete`; a cut connection leaves it there and the next call resumes it with
//! a `Range` request (re-hashing the bytes already on disk). A file whose size or digest is wrong
//! is deleted, `.incomplete` included. The snapshot's links are made only once every file is
//! verified, so a failed download never leaves a half-filled snapshot behind.
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{check_repo_id, hf_home, hub_dir, is_safe_file_name, repo_folder};
use crate::error::{Error, Result};
use crate::pull::{agent, hex};

pub struct DownloadOptions {
    /// A branch, tag or commit (default `main`).
    pub revision: String,
    /// The hub cache to fill (default: `hub_dir()`).
    pub cache_dir: PathBuf,
    /// The hub's address (default `$HF_ENDPOINT`, else https://huggingface.co).
    pub endpoint: String,
    /// Sent as `Authorization: Bearer` to the hub (never to the servers it redirects to).
    pub token: Option<String>,
    /// Every file of the repository instead of those a model needs (`wanted`).
    pub all_files: bool,
}

impl Default for DownloadOptions {
    fn default() -> Self {
        DownloadOptions { revision: "main".into(), cache_dir: hub_dir(), endpoint: default_endpoint(), token: hf_token(), all_files: false }
    }
}

pub fn default_endpoint() -> String {
    std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()).unwrap_or_else(|| "https://huggingface.co".into())
}

/// `$HF_TOKEN`, else the token `hf auth login` saved in `$HF_HOME/token`.
pub fn hf_token() -> Option<String> {
    std::env::var("HF_TOKEN")
        .ok()
        .or_else(|| fs::read_to_string(hf_home().join("token")).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

/// How far one file (and the whole download) has come. Reported at most every 50 ms per file,
/// and always once a file is complete (`received == total`; also for files already cached).
pub struct FileProgress<'a> {
    pub file: &'a str,
    pub received: u64,
    pub total: u64,
    /// Bytes of every file of the download so far, and in all.
    pub repo_received: u64,
    pub repo_total: u64,
}

/// What a file must be: its SHA-256 (LFS files) or git blob SHA-1 (small files), in hex.
#[derive(Debug, Clone, PartialEq)]
enum Check {
    Sha256(String),
    GitSha1(String),
}

#[derive(Debug, Clone, PartialEq)]
struct RepoFile {
    name: String,
    size: u64,
    check: Check,
}

impl RepoFile {
    /// The blob's name in the cache: its digest, as huggingface_hub names it.
    fn blob(&self) -> &str {
        match &self.check {
            Check::Sha256(h) | Check::GitSha1(h) => h,
        }
    }
}

/// The files a model needs, after mlx-lm's download patterns: configs and tokenizer files
/// (`*.json`, `*.jsonl`, `*.txt`, `*.jinja`, `tokenizer.model`, `*.tiktoken`), the weights
/// (`model*.safetensors`; not `consolidated.safetensors`, a second copy of the same weights
/// that the loader would read twice) and the model card (its license). Top level only: the
/// loader reads nothing from subfolders (ONNX exports, original checkpoints).
fn wanted(name: &str) -> bool {
    !name.contains('/')
        && ([".json", ".jsonl", ".txt", ".jinja", ".tiktoken"].iter().any(|ext| name.ends_with(ext))
            || matches!(name, "tokenizer.model" | "tiktoken.model" | "README.md")
            || (name.starts_with("model") && name.ends_with(".safetensors")))
}

#[derive(Deserialize)]
struct ApiRepo {
    sha: String,
    siblings: Vec<ApiFile>,
}

#[derive(Deserialize)]
struct ApiFile {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    /// Older listings call it `oid`.
    #[serde(alias = "oid")]
    sha256: String,
    size: u64,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The commit and the files to fetch from `GET /api/models/{repo}/revision/{rev}?blobs=true`.
/// The listing is untrusted: the commit becomes a folder name, file names become paths and
/// digests become blob names, so each is checked before use; an unsafe file name fails the whole
/// download rather than being skipped.
fn parse_listing(body: &[u8], all_files: bool) -> Result<(String, Vec<RepoFile>)> {
    let bad = |what: String| Error::Download(format!("the hub's file listing {what}"));
    let repo: ApiRepo = serde_json::from_slice(body).map_err(|e| bad(format!("is not valid: {e}")))?;
    if !is_hex(&repo.sha, 40) {
        return Err(bad(format!("has an invalid commit '{}'", repo.sha)));
    }
    let mut files = Vec::new();
    for f in repo.siblings {
        if !is_safe_file_name(&f.rfilename) {
            return Err(bad(format!("names an unsafe file path {:?}", f.rfilename)));
        }
        if !all_files && !wanted(&f.rfilename) {
            continue;
        }
        let (size, check) = match (f.lfs, f.blob_id, f.size) {
            (Some(lfs), _, _) if is_hex(&lfs.sha256, 64) => (lfs.size, Check::Sha256(lfs.sha256.to_ascii_lowercase())),
            (None, Some(id), Some(size)) if is_hex(&id, 40) => (size, Check::GitSha1(id.to_ascii_lowercase())),
            _ => return Err(bad(format!("has no valid size and digest for {}", f.rfilename))),
        };
        files.push(RepoFile { name: f.rfilename, size, check });
    }
    Ok((repo.sha.to_ascii_lowercase(), files))
}

/// Path segments percent-encoded (everything but letters, digits and `-._~`), `/` kept.
fn encode_path(p: &str) -> String {
    const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
    p.split('/').map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect::<Vec<_>>().join("/")
}

/// Downloads `repo_id` at `o.revision` into the hub cache; returns the snapshot folder. Files
/// already in the cache (a blob of the listed size) are not fetched again. `on_progress`
/// returning `false` stops the download (`CANCELLED`; a partial file stays, resumable).
/// Blocking: runs on the caller's thread.
pub fn download_model(repo_id: &str, o: &DownloadOptions, on_progress: &mut dyn FnMut(&FileProgress) -> bool) -> Result<PathBuf> {
    check_repo_id(repo_id)?;
    if !is_safe_file_name(&o.revision) {
        return Err(Error::option("revision", format!("'{}' is not a branch, tag or commit", o.revision)));
    }
    let endpoint = o.endpoint.trim_end_matches('/');
    let http = agent();
    let url = format!("{endpoint}/api/models/{repo_id}/revision/{}?blobs=true", encode_path(&o.revision).replace('/', "%2F"));
    let body = get(&http, &url, o.token.as_deref(), 0)
        .and_then(|mut r| r.body_mut().read_to_vec())
        .map_err(|e| http_error(&url, e))?;
    let (commit, files) = parse_listing(&body, o.all_files)?;

    let repo_dir = o.cache_dir.join(repo_folder(repo_id));
    let blobs = repo_dir.join("blobs");
    fs::create_dir_all(&blobs).map_err(|e| Error::io(&blobs, e))?;
    let mut report = Reporter { last: None, repo_done: 0, repo_total: files.iter().fold(0u64, |a, f| a.saturating_add(f.size)), on_progress };
    for f in &files {
        let blob = blobs.join(f.blob());
        if fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == f.size) {
            report.file(f, f.size, true)?;
        } else {
            let url = format!("{endpoint}/{repo_id}/resolve/{commit}/{}", encode_path(&f.name));
            fetch(&http, &url, o.token.as_deref(), &blob, f, &mut report)?;
        }
        report.repo_done = report.repo_done.saturating_add(f.size);
    }
    let snapshot = repo_dir.join("snapshots").join(&commit);
    for f in &files {
        link(&snapshot, f)?;
    }
    if o.revision != commit {
        write_ref(&repo_dir, &o.revision, &commit)?;
    }
    Ok(snapshot)
}

/// Throttles progress reports and carries the callback's wish to stop.
struct Reporter<'a> {
    last: Option<Instant>,
    repo_done: u64,
    repo_total: u64,
    on_progress: &'a mut dyn FnMut(&FileProgress) -> bool,
}

impl Reporter<'_> {
    fn file(&mut self, f: &RepoFile, received: u64, force: bool) -> Result<()> {
        if !force && self.last.is_some_and(|t| t.elapsed() < Duration::from_millis(50)) {
            return Ok(());
        }
        self.last = Some(Instant::now());
        let p = FileProgress { file: &f.name, received, total: f.size, repo_received: self.repo_done.saturating_add(received), repo_total: self.repo_total };
        if (self.on_progress)(&p) {
            Ok(())
        } else {
            Err(Error::Cancelled("requested"))
        }
    }
}

fn get(http: &ureq::Agent, url: &str, token: Option<&str>, from: u64) -> std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    if from > 0 {
        req = req.header("Range", &format!("bytes={from}-"));
    }
    req.call()
}

fn http_error(url: &str, e: ureq::Error) -> Error {
    let hint = match e {
        ureq::Error::StatusCode(401 | 403) => " (a gated or private repository? set HF_TOKEN or pass a token)",
        ureq::Error::StatusCode(404) => " (no such repository, revision or file)",
        _ => "",
    };
    Error::Download(format!("{url}: {e}{hint}"))
}

/// The running digest of a file, as its `Check` wants it.
enum Hasher {
    Sha256(Sha256),
    GitSha1(sha1::Sha1),
}

impl Hasher {
    fn new(f: &RepoFile) -> Hasher {
        match f.check {
            Check::Sha256(_) => Hasher::Sha256(Sha256::new()),
            Check::GitSha1(_) => {
                // A git blob id is the SHA-1 of a "blob <size>\0" header and the content.
                let mut h = sha1::Sha1::new();
                h.update(format!("blob {}\0", f.size).as_bytes());
                Hasher::GitSha1(h)
            }
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::GitSha1(h) => h.update(bytes),
        }
    }

    fn finish(self) -> String {
        match self {
            Hasher::Sha256(h) => hex(&h.finalize()),
            Hasher::GitSha1(h) => hex(&h.finalize()),
        }
    }
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Fetches one file into `blob`: resumes `<blob>.incomplete` if there is one, verifies, renames.
fn fetch(http: &ureq::Agent, url: &str, token: Option<&str>, blob: &Path, f: &RepoFile, report: &mut Reporter) -> Result<()> {
    let _lock = Lock::take(blob, &f.name)?;
    let part = with_suffix(blob, ".incomplete");
    let io = |e| Error::io(&part, e);
    let mut out = OpenOptions::new().create(true).append(true).open(&part).map_err(io)?;
    let mut offset = out.metadata().map_err(io)?.len();
    if offset > f.size {
        out.set_len(0).map_err(io)?;
        offset = 0;
    }
    let mut hasher = Hasher::new(f);
    if offset > 0 {
        // Resuming: the digest must cover the bytes already on disk too.
        let mut prefix = File::open(&part).map_err(io)?.take(offset);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = prefix.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
    }
    if offset < f.size {
        let mut resp = get(http, url, token, offset);
        // A server that cannot or will not resume (416, a whole 200, another range) sends the
        // file from its start, and the partial file starts over with it.
        let resumed = |r: &ureq::http::Response<ureq::Body>| {
            r.status() == 206 && content_range_start(r) == Some(offset)
        };
        if offset > 0 && !resp.as_ref().is_ok_and(resumed) {
            out.set_len(0).map_err(io)?;
            offset = 0;
            hasher = Hasher::new(f);
            resp = get(http, url, token, 0);
        }
        let mut resp = resp.map_err(|e| http_error(url, e))?;
        let mut body = resp.body_mut().with_config().limit(u64::MAX).reader();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    return Err(Error::Download(format!(
                        "{url}: {e} after {offset} of {} bytes (kept in {}: run again to resume)",
                        f.size,
                        part.display()
                    )))
                }
            };
            if offset + n as u64 > f.size {
                drop(out);
                let _ = fs::remove_file(&part);
                return Err(Error::Checksum { file: f.name.clone(), reason: format!("the server sent more than the {} bytes the hub lists", f.size) });
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io)?;
            offset += n as u64;
            report.file(f, offset, offset == f.size)?;
        }
    }
    if offset < f.size {
        return Err(Error::Download(format!(
            "{url}: the connection ended after {offset} of {} bytes (kept in {}: run again to resume)",
            f.size,
            part.display()
        )));
    }
    let got = hasher.finish();
    if got != f.blob() {
        drop(out);
        let _ = fs::remove_file(&part);
        let kind = if matches!(f.check, Check::Sha256(_)) { "sha256" } else { "git blob id" };
        return Err(Error::Checksum { file: f.name.clone(), reason: format!("{kind} {got}, the hub lists {}; the file was deleted", f.blob()) });
    }
    out.sync_all().map_err(io)?;
    fs::rename(&part, blob).map_err(|e| Error::io(blob, e))?;
    if f.size == 0 {
        report.file(f, 0, true)?;
    }
    Ok(())
}

/// The first byte of a `Content-Range: bytes START-END/TOTAL` answer.
fn content_range_start(r: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let v = r.headers().get("content-range")?.to_str().ok()?;
    v.strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

/// `<blob>.lock`, held while one writer appends to `<blob>.incomplete`: two writers (two `get`s,
/// or a `get` and a server) would interleave their bytes. A lock whose process has ended is
/// taken over; one of a live process fails this download with the holder's pid.
struct Lock(PathBuf);

impl Lock {
    fn take(blob: &Path, name: &str) -> Result<Lock> {
        let path = with_suffix(blob, ".lock");
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    let _ = writeln!(file, "{}", std::process::id());
                    return Ok(Lock(path));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<i32>().ok());
                    // A lock without a pid is being written this instant, unless it is old.
                    let live = holder.map_or_else(|| fs::metadata(&path).and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|a| a < Duration::from_secs(60))), alive);
                    if live {
                        return Err(Error::Download(format!(
                            "another download of {name} is in progress (pid {}); wait for it, or delete {} if none is running",
                            holder.map_or_else(|| "unknown".into(), |p| p.to_string()),
                            path.display()
                        )));
                    }
                    let _ = fs::remove_file(&path);
                }
                Err(e) => return Err(Error::io(&path, e)),
            }
        }
        Err(Error::Download(format!("could not take {}", path.display())))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 sends nothing; it only asks whether `pid` exists.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// `snapshots/<commit>/<file>` → `../../blobs/<id>` (one more `../` per subfolder), made under a
/// temporary name and renamed over any older link, so the link appears whole.
fn link(snapshot: &Path, f: &RepoFile) -> Result<()> {
    let dest = snapshot.join(&f.name);
    let dir = dest.parent().unwrap_or(snapshot);
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let target = PathBuf::from("../".repeat(f.name.matches('/').count() + 2)).join("blobs").join(f.blob());
    if fs::read_link(&dest).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let tmp = dir.join(format!(".{}.link-{}", f.name.rsplit('/').next().unwrap_or(&f.name), std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&target, &tmp).map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &dest).map_err(|e| Error::io(&dest, e))
}

/// `refs/<revision>` holding the commit, written whole (temporary file, rename).
fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> Result<()> {
    let path = repo_dir.join("refs").join(revision);
    let dir = path.parent().unwrap_or(repo_dir);
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = with_suffix(&path, &format!(".tmp-{}", std::process::id()));
    fs::write(&tmp, commit).map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    fn listing(siblings: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "sha": SHA, "siblings": siblings })).unwrap()
    }

    #[test]
    fn listing_keeps_what_a_model_needs() {
        let lfs = "a".repeat(64);
        let body = listing(serde_json::json!([
            { "rfilename": "config.json", "size": 10, "blobId": "b".repeat(40) },
            { "rfilename": "model.safetensors", "size": 5, "blobId": "c".repeat(40), "lfs": { "sha256": lfs, "size": 1000 } },
            { "rfilename": "consolidated.safetensors", "size": 1000, "blobId": "d".repeat(40), "lfs": { "oid": "e".repeat(64), "size": 1000 } },
            { "rfilename": "onnx/model.json", "size": 1, "blobId": "f".repeat(40) },
            { "rfilename": "pytorch_model.bin", "size": 1, "blobId": "f".repeat(40) },
        ]));
        let (commit, files) = parse_listing(&body, false).unwrap();
        assert_eq!(commit, SHA);
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["config.json", "model.safetensors"]);
        assert_eq!(files[0].check, Check::GitSha1("b".repeat(40)));
        assert_eq!((files[1].size, files[1].blob()), (1000, lfs.as_str()), "LFS files are named and sized by their LFS object");
        let (_, all) = parse_listing(&body, true).unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[2].check, Check::Sha256("e".repeat(64)), "the older `oid` spelling is read too");
    }

    #[test]
    fn untrusted_listings_are_refused() {
        let file = |name: &str| serde_json::json!([{ "rfilename": name, "size": 1, "blobId": "b".repeat(40) }]);
        let err = parse_listing(&listing(file("../../x.json")), false).unwrap_err();
        assert!(err.to_string().contains("unsafe file path"), "{err}");
        let bad_commit = serde_json::to_vec(&serde_json::json!({ "sha": "../x", "siblings": [] })).unwrap();
        assert_eq!(parse_listing(&bad_commit, false).unwrap_err().code(), "DOWNLOAD_FAILED");
        let no_digest = listing(serde_json::json!([{ "rfilename": "config.json", "size": 1, "blobId": "xyz" }]));
        assert!(parse_listing(&no_digest, false).unwrap_err().to_string().contains("digest"));
        assert!(parse_listing(b"<html>", false).is_err());
    }

    #[test]
    fn url_paths_are_encoded() {
        assert_eq!(encode_path("model-00001-of-00002.safetensors"), "model-00001-of-00002.safetensors");
        assert_eq!(encode_path("sub dir/a#b?.json"), "sub%20dir/a%23b%3F.json");
    }

    #[test]
    fn git_blob_ids_match_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        let f = RepoFile { name: "x".into(), size: 6, check: Check::GitSha1(String::new()) };
        let mut h = Hasher::new(&f);
        h.update(b"hello\n");
        assert_eq!(h.finish(), "ce013625030ba8dba906f756967f9e9ca394464a");
    }
}
