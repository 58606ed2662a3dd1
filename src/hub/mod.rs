//! Models on disk: the Hugging Face hub cache that Python's huggingface_hub also reads and writes
//! (`<hub>/models--org--name/{blobs,snapshots/<commit>,refs/<revision>}`), and mlx-bun's own
//! `$MLX_BUN_HOME/models` (plain model folders and `.gguf` files). `registry` indexes both;
//! `download` fills the hub cache from the hub's HTTP file API.
pub mod download;
pub mod registry;

use std::path::PathBuf;

use crate::error::{Error, Result};

/// `$HF_HOME`, else `~/.cache/huggingface` (huggingface_hub's default).
pub fn hf_home() -> PathBuf {
    if let Some(h) = std::env::var_os("HF_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let base = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    base.join(".cache").join("huggingface")
}

/// The hub cache in huggingface_hub's order: `$HF_HUB_CACHE`, else `$HF_HOME/hub`.
pub fn hub_dir() -> PathBuf {
    match std::env::var_os("HF_HUB_CACHE").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => hf_home().join("hub"),
    }
}

/// `org/name` → `models--org--name`, the repository's folder in the hub cache.
pub fn repo_folder(repo_id: &str) -> String {
    format!("models--{}", repo_id.replace('/', "--"))
}

/// `models--org--name` → `org/name`; `None` for folders of datasets, spaces and other files.
pub fn repo_id_of(folder: &str) -> Option<String> {
    folder.strip_prefix("models--").filter(|rest| !rest.is_empty()).map(|rest| rest.replace("--", "/"))
}

/// A repository id as the hub allows them (`name` or `org/name`; letters, digits, `-`, `_`,
/// `.`; no `--` or `..`). Anything else is refused before it reaches a URL or a folder name: `--`
/// would make the cache folder name ambiguous, `..` or a leading `.` could leave the cache.
pub fn check_repo_id(repo_id: &str) -> Result<()> {
    let parts: Vec<&str> = repo_id.split('/').collect();
    let part_ok = |p: &&str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && !p.contains("--")
            && !p.contains("..")
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if parts.len() <= 2 && parts.iter().all(part_ok) && repo_id.len() <= 200 {
        Ok(())
    } else {
        Err(Error::option("repoId", format!("'{repo_id}' is not a Hugging Face repository id (org/name)")))
    }
}

/// Whether a file name from the hub's listing stays inside the snapshot folder once joined to
/// it: relative, no empty, `.` or `..` segment, no backslash or NUL. The listing is untrusted
/// input; a name like `../../.ssh/x` must never become a path we write.
pub fn is_safe_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(['\\', '\0'])
        && name.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_folder_names_round_trip() {
        assert_eq!(repo_folder("mlx-community/Qwen3-0.6B-4bit"), "models--mlx-community--Qwen3-0.6B-4bit");
        assert_eq!(repo_folder("gpt2"), "models--gpt2");
        assert_eq!(repo_id_of("models--mlx-community--Qwen3-0.6B-4bit").as_deref(), Some("mlx-community/Qwen3-0.6B-4bit"));
        assert_eq!(repo_id_of("models--gpt2").as_deref(), Some("gpt2"));
        assert_eq!(repo_id_of("datasets--a--b"), None);
        assert_eq!(repo_id_of("models--"), None);
    }

    #[test]
    fn repo_ids_are_checked() {
        for ok in ["gpt2", "org/name", "mlx-community/Qwen3-0.6B-4bit", "a_b/c.d"] {
            assert!(check_repo_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/", "a/b/c", "../x", "a/..", "a--b/c", "a/.hidden", "a b/c", "a/b?c", "-a/b"] {
            assert_eq!(check_repo_id(bad).unwrap_err().code(), "INVALID_OPTION", "{bad}");
        }
    }

    #[test]
    fn unsafe_file_names_are_refused() {
        for ok in ["config.json", "sub/dir/file.txt", "a..b"] {
            assert!(is_safe_file_name(ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\\b", "a\0b", "a/"] {
            assert!(!is_safe_file_name(bad), "{bad:?}");
        }
    }
}
