//! `Registry`: an index of the models on this machine, as mlx-bun keeps it — one record per hub
//! snapshot (`<hub>/models--org--name/snapshots/<commit>`) that has a config.json and
//! safetensors, plus each model folder and `.gguf` file in `$MLX_BUN_HOME/models`. Scanning
//! reads config.json, small JSON side files and safetensors headers, never tensor data. The index
//! is kept in a JSON file (mlx-bun keeps an SQLite one) so that `list()` in a later process sees
//! the last scan.
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::repo_id_of;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::model::gguf_weights;

/// One model on disk; the fields and their meaning are mlx-bun's `ModelRecord`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelRecord {
    /// The snapshot folder, model folder or `.gguf` file (what `loadModel` takes).
    pub path: String,
    /// `org/name` for hub snapshots; the folder's name or the file's stem for local models.
    pub repo_id: String,
    pub model_type: String,
    pub param_count: Option<u64>,
    /// Language-model weight bytes (every `*.safetensors` but the vision sidecar; a GGUF's size).
    pub size_bytes: u64,
    /// `optiq_vision.safetensors` bytes (mlx-bun's bf16 vision sidecar).
    pub sidecar_bytes: u64,
    /// Bytes of `.experts.` tensors (mixture-of-experts models; 0 for dense ones).
    pub experts_bytes: u64,
    pub quant_bits: Option<u64>,
    pub quant_group_size: Option<u64>,
    /// `affine` (or config.json's `mode`) for MLX-quantized folders; for a GGUF, the GGML type
    /// holding most of its bytes (`Q4_K`, `Q8_0`, `BF16`, …).
    pub quant_mode: Option<String>,
    pub has_vision_sidecar: bool,
    /// config.json's `vision_config.model_type` when it names a vision tower (`*_vision`).
    pub vision_config_type: Option<String>,
    pub has_kv_config: bool,
    pub has_tool_template: bool,
    pub num_layers: Option<u64>,
    pub hidden_size: Option<u64>,
    pub vocab_size: Option<u64>,
    /// From the model card's front matter (README.md) or a GGUF's `general.license`.
    pub license: Option<String>,
    /// When this record was scanned, in milliseconds since the Unix epoch.
    pub scanned_at: u64,
}

/// mlx-bun's notion of vision-capable: the SigLIP sidecar, or an encoder-free unified tower.
pub fn vision_capable(m: &ModelRecord) -> bool {
    m.has_vision_sidecar || m.vision_config_type.as_deref().is_some_and(|t| t.ends_with("unified_vision"))
}

/// `list()`'s filters: all given ones must hold.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub vision: Option<bool>,
    pub max_bytes: Option<f64>,
    /// A case-insensitive fragment of the repo id or the model type.
    pub query: Option<String>,
}

impl Filter {
    fn matches(&self, m: &ModelRecord) -> bool {
        self.vision.is_none_or(|v| vision_capable(m) == v)
            && self.max_bytes.is_none_or(|max| m.size_bytes as f64 <= max)
            && self.query.as_deref().is_none_or(|q| {
                let q = q.to_lowercase();
                m.repo_id.to_lowercase().contains(&q) || m.model_type.to_lowercase().contains(&q)
            })
    }
}

#[derive(Serialize, Deserialize)]
struct IndexFile {
    version: u32,
    models: Vec<ModelRecord>,
}
const INDEX_VERSION: u32 = 1;

pub struct Registry {
    /// Where the index is kept; `None` (mlx-bun's `":memory:"`) keeps it in this process only.
    index: Option<PathBuf>,
    hub: PathBuf,
    /// `$MLX_BUN_HOME`: its `models/` folder is scanned too.
    home: PathBuf,
    models: Mutex<Vec<ModelRecord>>,
}

/// The default index file, `$MLX_BUN_HOME/registry.json`.
pub fn default_index(home: &Path) -> PathBuf {
    home.join("registry.json")
}

impl Registry {
    /// Opens the index at `index` (`None`: in memory), scanning `hub` and `home/models` on
    /// `scan()`. An index that cannot be read (missing, damaged, another version) starts empty:
    /// it is derived data that the next scan rebuilds.
    pub fn open(index: Option<PathBuf>, hub: PathBuf, home: PathBuf) -> Registry {
        let models = index
            .as_deref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|bytes| serde_json::from_slice::<IndexFile>(&bytes).ok())
            .filter(|f| f.version == INDEX_VERSION)
            .map(|f| f.models)
            .unwrap_or_default();
        Registry { index, hub, home, models: Mutex::new(models) }
    }

    /// Rescans `hub` (default: the hub given to `open`) and `$MLX_BUN_HOME/models`: their
    /// records are replaced by what is there now; records of other folders (an earlier scan of
    /// another hub) stay while their files exist. Returns how many models the scan found.
    /// Blocking: reads the disk.
    pub fn scan(&self, hub: Option<&Path>) -> Result<usize> {
        let roots = [hub.unwrap_or(&self.hub).to_path_buf(), self.home.join("models")];
        let mut found = scan_hub(&roots[0])?;
        found.extend(scan_local(&roots[1])?);
        let count = found.len();
        let snapshot = {
            let mut models = self.lock();
            models.retain(|m| {
                let p = Path::new(&m.path);
                p.exists() && !roots.iter().any(|r| p.starts_with(r))
            });
            models.extend(found);
            models.clone()
        };
        if let Some(path) = &self.index {
            save_index(path, snapshot)?;
        }
        Ok(count)
    }

    /// The records matching `filter`, smallest first, without those whose files are gone.
    pub fn list(&self, filter: &Filter) -> Vec<ModelRecord> {
        let mut out: Vec<ModelRecord> =
            self.lock().iter().filter(|m| filter.matches(m) && Path::new(&m.path).exists()).cloned().collect();
        out.sort_by(|a, b| a.size_bytes.cmp(&b.size_bytes).then_with(|| a.repo_id.cmp(&b.repo_id)).then_with(|| a.path.cmp(&b.path)));
        out
    }

    /// `list()` with one record per repository: the snapshot `refs/main` names, else the one
    /// scanned last (the hub cache keeps a snapshot per downloaded revision).
    pub fn list_canonical(&self, filter: &Filter) -> Vec<ModelRecord> {
        let mut order: Vec<String> = Vec::new();
        let mut by_repo: BTreeMap<String, Vec<ModelRecord>> = BTreeMap::new();
        for m in self.list(filter) {
            if !by_repo.contains_key(&m.repo_id) {
                order.push(m.repo_id.clone());
            }
            by_repo.entry(m.repo_id.clone()).or_default().push(m);
        }
        order.iter().map(|r| canonical(&by_repo[r])).collect()
    }

    /// Exactly one model for `query`: a model folder or file path, a repo id, or a fragment of a
    /// repo id or model type (mlx-bun's rule). Several revisions of one repository count as one
    /// (its canonical snapshot); an exact repo id wins over longer ids containing it; drafter
    /// models (`*_assistant`) are never candidates. None: `MODEL_NOT_FOUND`; several
    /// repositories: `AMBIGUOUS_MODEL` listing them.
    pub fn resolve(&self, query: &str) -> Result<ModelRecord> {
        let all = self.list(&Filter::default());
        let exact: Vec<ModelRecord> = all.iter().filter(|m| m.repo_id.eq_ignore_ascii_case(query)).cloned().collect();
        if !exact.is_empty() {
            return Ok(canonical(&exact));
        }
        // A path that holds a model; one that does not (a folder that happens to share a
        // fragment's name) falls through to fragment matching.
        if let Some(real) = Some(Path::new(query)).filter(|_| !query.is_empty()).and_then(|p| std::fs::canonicalize(p).ok()) {
            let known = all.iter().find(|m| std::fs::canonicalize(&m.path).is_ok_and(|p| p == real));
            if let Some(m) = known.cloned().or_else(|| scan_path(&real, &name_of(&real))) {
                return Ok(m);
            }
        }
        let matches: Vec<ModelRecord> = self
            .list(&Filter { query: Some(query.to_owned()), ..Default::default() })
            .into_iter()
            .filter(|m| !m.model_type.ends_with("_assistant"))
            .collect();
        let mut repos: Vec<String> = matches.iter().map(|m| m.repo_id.clone()).collect();
        repos.sort();
        repos.dedup();
        match repos.len() {
            0 => Err(Error::NoModelMatch(query.to_owned())),
            1 => Ok(canonical(&matches)),
            _ => Err(Error::AmbiguousModel { query: query.to_owned(), candidates: repos }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<ModelRecord>> {
        // The list is replaced whole under the lock, so a panic elsewhere cannot leave it torn.
        self.models.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Of several snapshots of one repository: the one `refs/main` names, else the latest scanned.
fn canonical(matches: &[ModelRecord]) -> ModelRecord {
    let on_main = matches.iter().find(|m| {
        let snap = Path::new(&m.path);
        let head = snap.parent().and_then(Path::parent).and_then(|repo| std::fs::read_to_string(repo.join("refs").join("main")).ok());
        head.is_some_and(|h| snap.file_name().is_some_and(|n| n.to_string_lossy() == h.trim()))
    });
    on_main
        .or_else(|| matches.iter().max_by(|a, b| a.scanned_at.cmp(&b.scanned_at).then_with(|| b.path.cmp(&a.path))))
        .cloned()
        .expect("canonical() is given at least one record")
}

/// Writes the index through a temporary file and a rename, so a reader never sees half of it.
fn save_index(path: &Path, models: Vec<ModelRecord>) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let bytes = serde_json::to_vec(&IndexFile { version: INDEX_VERSION, models }).map_err(|e| Error::Internal(e.to_string()))?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Entries of `dir` (sorted, so scans are reproducible); a missing folder has none.
fn entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let read = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).collect();
    out.sort();
    Ok(out)
}

fn scan_hub(hub: &Path) -> Result<Vec<ModelRecord>> {
    let mut out = Vec::new();
    for repo in entries(hub)? {
        let Some(repo_id) = repo.file_name().and_then(|n| repo_id_of(&n.to_string_lossy())) else { continue };
        // A repository folder we cannot read is skipped like any other unusable snapshot.
        for snap in entries(&repo.join("snapshots")).unwrap_or_default() {
            out.extend(scan_folder(&snap, &repo_id));
        }
    }
    Ok(out)
}

fn scan_local(models: &Path) -> Result<Vec<ModelRecord>> {
    let mut out = Vec::new();
    for p in entries(models)? {
        let Some(name) = p.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
        // Hidden names are downloads in progress (`mlx-bun pull` writes `.name.part`).
        if !name.starts_with('.') {
            out.extend(scan_path(&p, &name));
        }
    }
    Ok(out)
}

/// The repo id a model at `path` is listed under: `org/name` for a hub snapshot folder, else
/// the folder's or file's name.
fn name_of(path: &Path) -> String {
    let parent = path.parent();
    let repo = parent
        .filter(|p| p.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(Path::parent)
        .and_then(|r| repo_id_of(&r.file_name()?.to_string_lossy()));
    repo.unwrap_or_else(|| path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default())
}

/// The record of the model folder or `.gguf` file at `path`, as a scan would index it; `None`
/// if it holds no model.
pub fn record(path: &Path) -> Option<ModelRecord> {
    scan_path(path, &name_of(path))
}

/// A model folder or `.gguf` file as a record named after it; `None` if it is neither.
fn scan_path(p: &Path, name: &str) -> Option<ModelRecord> {
    if p.is_dir() {
        scan_folder(p, name)
    } else if let Some(stem) = name.strip_suffix(".gguf") {
        scan_gguf(p, stem)
    } else {
        None
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// A folder with config.json and at least one `*.safetensors` (mlx-bun's rule); `None` if not.
fn scan_folder(dir: &Path, repo_id: &str) -> Option<ModelRecord> {
    let config = read_json(&dir.join("config.json")).filter(Value::is_object)?;
    let (mut size, mut sidecar, mut experts, mut weights) = (0u64, 0u64, 0u64, false);
    for f in entries(dir).ok()? {
        if f.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        weights = true;
        // metadata() follows the snapshot's symlinks to the blobs; a dangling one counts 0.
        let bytes = std::fs::metadata(&f).map_or(0, |m| m.len());
        if f.file_name().is_some_and(|n| n == "optiq_vision.safetensors") {
            sidecar += bytes;
        } else {
            size += bytes;
            experts += expert_bytes(&f).unwrap_or(0);
        }
    }
    if !weights {
        return None;
    }
    let text = config.get("text_config").filter(|t| t.is_object()).unwrap_or(&config);
    let quant = config.get("quantization").or_else(|| config.get("quantization_config")).filter(|q| q.is_object());
    let num = |v: &Value, key: &str| v.get(key).and_then(Value::as_u64);
    let tool_template = ["chat_template.jinja", "tokenizer_config.json"]
        .iter()
        .any(|f| std::fs::read_to_string(dir.join(f)).is_ok_and(|s| s.contains("tool_call")));
    Some(ModelRecord {
        path: dir.to_string_lossy().into_owned(),
        repo_id: repo_id.to_owned(),
        model_type: config.get("model_type").and_then(Value::as_str).unwrap_or("unknown").to_owned(),
        param_count: read_json(&dir.join("model.safetensors.index.json")).and_then(|i| i.pointer("/metadata/total_parameters")?.as_u64()),
        size_bytes: size,
        sidecar_bytes: sidecar,
        experts_bytes: experts,
        quant_bits: quant.and_then(|q| num(q, "bits")),
        quant_group_size: quant.and_then(|q| num(q, "group_size")),
        quant_mode: quant.map(|q| q.get("mode").and_then(Value::as_str).unwrap_or("affine").to_owned()),
        has_vision_sidecar: dir.join("optiq_vision.safetensors").exists(),
        vision_config_type: config
            .pointer("/vision_config/model_type")
            .and_then(Value::as_str)
            .filter(|t| t.ends_with("_vision"))
            .map(str::to_owned),
        has_kv_config: dir.join("kv_config.json").exists(),
        has_tool_template: tool_template,
        num_layers: num(text, "num_hidden_layers"),
        hidden_size: num(text, "hidden_size"),
        vocab_size: num(text, "vocab_size"),
        license: std::fs::read_to_string(dir.join("README.md")).ok().and_then(|s| readme_license(&s)),
        scanned_at: now_ms(),
    })
}

/// Bytes of the `.experts.` tensors a safetensors header lists (the header only; a header
/// length over 256 MiB is taken as damage, not read).
fn expert_bytes(path: &Path) -> Option<u64> {
    let mut f = File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = u64::from_le_bytes(len);
    if len == 0 || len > 256 << 20 {
        return None;
    }
    let mut header = Vec::new();
    f.take(len).read_to_end(&mut header).ok()?;
    let header: BTreeMap<String, Value> = serde_json::from_slice(&header).ok()?;
    Some(
        header
            .iter()
            // Hugging Face's per-expert tensors, or mlx-lm's stacked `switch_mlp` ones.
            .filter(|(name, _)| name.contains(".experts.") || name.contains(".switch_mlp."))
            .filter_map(|(_, t)| {
                let o = t.get("data_offsets")?;
                Some(o.get(1)?.as_u64()?.saturating_sub(o.get(0)?.as_u64()?))
            })
            .fold(0u64, u64::saturating_add),
    )
}

/// A `.gguf` file, from its header (no tensor data is read).
fn scan_gguf(path: &Path, name: &str) -> Option<ModelRecord> {
    let g = Gguf::open(path).ok()?;
    // The HF-style config when this engine knows the architecture; the raw name otherwise.
    let config = gguf_weights::config(&g).ok();
    let mut by_type: BTreeMap<&'static str, u64> = BTreeMap::new();
    for t in &g.tensors {
        *by_type.entry(t.kind.name()).or_default() += t.byte_len().unwrap_or(0);
    }
    let dominant = by_type.iter().max_by_key(|(_, &b)| b).map(|(&t, _)| t.to_owned());
    let params = g.tensors.iter().try_fold(0u64, |acc, t| acc.checked_add(t.n_elements()?));
    Some(ModelRecord {
        path: path.to_string_lossy().into_owned(),
        repo_id: name.to_owned(),
        model_type: config.as_ref().map(|c| c.model_type.clone()).or_else(|| g.architecture().map(str::to_owned)).unwrap_or_else(|| "unknown".into()),
        param_count: params,
        size_bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
        sidecar_bytes: 0,
        experts_bytes: 0,
        quant_bits: None,
        quant_group_size: None,
        quant_mode: dominant,
        has_vision_sidecar: false,
        vision_config_type: None,
        has_kv_config: false,
        has_tool_template: g.get_str("tokenizer.chat_template").is_some_and(|t| t.contains("tool_call")),
        num_layers: config.as_ref().map(|c| c.num_hidden_layers as u64),
        hidden_size: config.as_ref().map(|c| c.hidden_size as u64),
        vocab_size: config.as_ref().map(|c| c.vocab_size as u64),
        license: g.get_str("general.license").map(str::to_owned),
        scanned_at: now_ms(),
    })
}

/// `license:` from a model card's YAML front matter (`license_name:` when the license is
/// `other`), quotes removed.
fn readme_license(readme: &str) -> Option<String> {
    let head = readme.get(..readme.len().min(4096)).unwrap_or(readme);
    let body = head.strip_prefix("---")?;
    let front = body.find("\n---").map_or(body, |end| &body[..end]);
    let field = |key: &str| {
        front.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')).map(|v| v.trim().trim_matches(['"', '\'']).to_owned()).filter(|v| !v.is_empty())
    };
    match field("license") {
        Some(l) if l == "other" => field("license_name").or(Some(l)),
        l => l,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn license_from_front_matter() {
        assert_eq!(readme_license("---\nlicense: apache-2.0\ntags: [a]\n---\n# Model").as_deref(), Some("apache-2.0"));
        assert_eq!(readme_license("---\nlicense: other\nlicense_name: 'gemma'\n---\n").as_deref(), Some("gemma"));
        assert_eq!(readme_license("---\nlicense: other\n---\n").as_deref(), Some("other"));
        assert_eq!(readme_license("# no front matter\nlicense: mit\n"), None);
        assert_eq!(readme_license("---\ntags: []\n---\nlicense: mit"), None);
    }

    #[test]
    fn filters_combine() {
        let m = |repo: &str, ty: &str, size: u64, vision: Option<&str>| ModelRecord {
            path: String::new(),
            repo_id: repo.into(),
            model_type: ty.into(),
            param_count: None,
            size_bytes: size,
            sidecar_bytes: 0,
            experts_bytes: 0,
            quant_bits: None,
            quant_group_size: None,
            quant_mode: None,
            has_vision_sidecar: false,
            vision_config_type: vision.map(str::to_owned),
            has_kv_config: false,
            has_tool_template: false,
            num_layers: None,
            hidden_size: None,
            vocab_size: None,
            license: None,
            scanned_at: 0,
        };
        let text = m("Org/Qwen3-0.6B", "qwen3", 100, None);
        let vision = m("org/gemma-4-12b", "gemma4", 500, Some("gemma4_unified_vision"));
        let siglip = m("org/gemma-4-e4b", "gemma4", 300, Some("gemma4_vision"));
        let f = |vision, max_bytes, query: Option<&str>| Filter { vision, max_bytes, query: query.map(str::to_owned) };
        assert!(f(None, None, Some("qwen")).matches(&text), "query is case-insensitive");
        assert!(f(None, None, Some("GEMMA4")).matches(&siglip), "query matches the model type");
        assert!(!f(None, Some(99.0), None).matches(&text) && f(None, Some(100.0), None).matches(&text));
        assert!(f(Some(true), None, None).matches(&vision) && !f(Some(true), None, None).matches(&siglip));
        assert!(f(Some(false), None, None).matches(&text) && !f(Some(false), None, None).matches(&vision));
    }
}
