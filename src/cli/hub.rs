//! `mlx-bun ls` (the models on disk, from the registry) and `mlx-bun get` (a download from the
//! Hugging Face hub into its cache).
use std::path::Path;

use clap::Args;
use indicatif::HumanBytes;

use crate::error::{Error, Result};
use crate::hub::download::{download_model, DownloadOptions};
use crate::hub::registry::{default_index, vision_capable, Filter, ModelRecord, Registry};
use crate::hub::hub_dir;
use crate::progress::Progress;
use crate::pull;

#[derive(Args)]
pub struct LsArgs {
    /// Only models whose repo id or model type contains this (case-insensitive).
    query: Option<String>,
    /// Only vision-capable models.
    #[arg(long)]
    vision: bool,
    /// Only models whose weights are at most this size (10GB, 800MB; a bare number is GB).
    #[arg(long, value_parser = parse_size)]
    max_size: Option<f64>,
    /// One row per cached snapshot instead of one per repository.
    #[arg(long)]
    all_revisions: bool,
    /// Print the records as a JSON array (the fields of `Registry.list()`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct GetArgs {
    /// `org/name` on the hub; without a `/`, a fragment of a model already downloaded (to
    /// refresh it).
    repo: String,
    /// Branch, tag or commit.
    #[arg(long, default_value = "main")]
    revision: String,
    /// Every file of the repository, not only those a model needs.
    #[arg(long)]
    all_files: bool,
}

/// mlx-bun's sizes: a number with an optional `GB`/`G` (the default) or `MB`/`M`.
fn parse_size(s: &str) -> std::result::Result<f64, String> {
    let t = s.trim().to_ascii_uppercase();
    let (num, unit) = match t.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => t.split_at(i),
        None => (t.as_str(), "G"),
    };
    let mult = match unit.trim() {
        "G" | "GB" => (1u64 << 30) as f64,
        "M" | "MB" => (1u64 << 20) as f64,
        _ => return Err(format!("bad size '{s}' (e.g. 10GB, 800MB)")),
    };
    num.parse::<f64>().map(|n| n * mult).map_err(|_| format!("bad size '{s}' (e.g. 10GB, 800MB)"))
}

pub(super) fn registry() -> Registry {
    let home = pull::home();
    Registry::open(Some(default_index(&home)), hub_dir(), home)
}

pub fn ls(a: LsArgs) -> Result<()> {
    let reg = registry();
    reg.scan(None)?;
    let filter = Filter { vision: a.vision.then_some(true), max_bytes: a.max_size, query: a.query };
    let models = if a.all_revisions { reg.list(&filter) } else { reg.list_canonical(&filter) };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&models).map_err(|e| Error::Internal(e.to_string()))?);
        return Ok(());
    }
    if models.is_empty() {
        eprintln!("mlx-bun: no models match (download one with `mlx-bun get org/name`)");
        return Ok(());
    }
    let rows: Vec<[String; 5]> = models.iter().map(row).collect();
    let header = ["MODEL", "SIZE", "TYPE", "QUANT", "PATH"].map(String::from);
    let widths: Vec<usize> = (0..5).map(|i| rows.iter().chain([&header]).map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    for r in [&header].into_iter().chain(&rows) {
        let cells: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", cells.join("  ").trim_end());
    }
    Ok(())
}

fn row(m: &ModelRecord) -> [String; 5] {
    let quant = match (m.quant_bits, m.quant_group_size, &m.quant_mode) {
        (Some(b), Some(g), _) => format!("{b}-bit g{g}"),
        (_, _, Some(mode)) => mode.clone(),
        _ => "-".into(),
    };
    let kind = if vision_capable(m) { format!("{} (vision)", m.model_type) } else { m.model_type.clone() };
    [m.repo_id.clone(), HumanBytes(m.size_bytes).to_string(), kind, quant, m.path.clone()]
}

pub fn get(a: GetArgs) -> Result<()> {
    let reg = registry();
    let repo = if a.repo.contains('/') {
        a.repo
    } else {
        // mlx-bun's rule: no `/` names a model already in the hub cache.
        reg.scan(None)?;
        let m = reg.resolve(&a.repo)?;
        if !Path::new(&m.path).starts_with(hub_dir()) {
            return Err(Error::option("repo", format!("{} is not from the Hugging Face hub; name it as org/name", m.path)));
        }
        m.repo_id
    };
    let opts = DownloadOptions { revision: a.revision, all_files: a.all_files, ..Default::default() };
    let mut bar: Option<Progress> = None;
    let mut shown = 0u64;
    let snapshot = download_model(&repo, &opts, &mut |p| {
        let bar = bar.get_or_insert_with(|| Progress::bytes(&format!("downloading {repo}"), Some(p.repo_total)));
        // A file restarted from its first byte (a server that would not resume) moves back.
        bar.inc(p.repo_received.saturating_sub(shown));
        shown = shown.max(p.repo_received);
        true
    })?;
    if let Some(bar) = bar {
        bar.finish();
    }
    reg.scan(None)?;
    println!("{}", snapshot.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_as_mlx_bun_reads_them() {
        assert_eq!(parse_size("10GB"), Ok(10.0 * (1u64 << 30) as f64));
        assert_eq!(parse_size("1.5g"), Ok(1.5 * (1u64 << 30) as f64));
        assert_eq!(parse_size("800MB"), Ok(800.0 * (1u64 << 20) as f64));
        assert_eq!(parse_size("2"), Ok(2.0 * (1u64 << 30) as f64));
        assert!(parse_size("10TB").is_err() && parse_size("GB").is_err());
    }
}
