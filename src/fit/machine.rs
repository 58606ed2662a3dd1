//! The machine `fit` predicts for: its RAM, its chip and its memory bandwidth (mlx-bun's
//! `thisMachine`, `APPLE_SKUS`). On a Mac the chip comes from sysctl and its bandwidth from
//! Apple's published figures below; elsewhere the CPU's name comes from /proc/cpuinfo and the
//! bandwidth is an estimate, labelled as such (`BandwidthSource::Estimated`): measuring it would
//! take seconds of memory traffic, too much for a synchronous call.
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// An Apple Silicon chip: its memory bandwidth and the RAM sizes it ships with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sku {
    pub chip: &'static str,
    pub bandwidth_gbs: f64,
    /// GB (2^30 bytes).
    pub ram_options: &'static [u32],
}

const fn sku(chip: &'static str, bandwidth_gbs: f64, ram_options: &'static [u32]) -> Sku {
    Sku { chip, bandwidth_gbs, ram_options }
}

/// mlx-bun's table of Apple Silicon chips (memory bandwidth in GB/s, Apple's figures).
pub const APPLE_SKUS: &[Sku] = &[
    sku("M1", 68.0, &[8, 16]),
    sku("M1 Pro", 200.0, &[16, 32]),
    sku("M1 Max", 400.0, &[32, 64]),
    sku("M1 Ultra", 800.0, &[64, 128]),
    sku("M2", 100.0, &[8, 16, 24]),
    sku("M2 Pro", 200.0, &[16, 32]),
    sku("M2 Max", 400.0, &[32, 64, 96]),
    sku("M2 Ultra", 800.0, &[64, 128, 192]),
    sku("M3", 100.0, &[8, 16, 24]),
    sku("M3 Pro", 150.0, &[18, 36]),
    sku("M3 Max", 400.0, &[36, 48, 64, 96, 128]),
    sku("M3 Ultra", 819.0, &[96, 256, 512]),
    sku("M4", 120.0, &[16, 24, 32]),
    sku("M4 Pro", 273.0, &[24, 48]),
    sku("M4 Max", 546.0, &[36, 48, 64, 128]),
];

/// A Mac whose chip the table does not know: mlx-bun's last resort, the M4 Pro's 273 GB/s.
const UNKNOWN_APPLE_GBS: f64 = 273.0;
/// Any other machine: dual-channel DDR4-3200's peak (2 × 25.6 GB/s), a typical desktop's.
const OTHER_GBS: f64 = 51.2;

/// What `fit` reads of a machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    pub ram_bytes: f64,
    pub bandwidth_gbs: f64,
}

impl Machine {
    /// `{ ramBytes, bandwidthGBs }` of a JavaScript machine spec (its name and chip only
    /// describe it; the numbers are checked by `fit`).
    pub fn from_json(v: &Value) -> Result<Machine> {
        let num = |k: &'static str| {
            v.get(k).and_then(Value::as_f64).ok_or_else(|| Error::option("machine", format!("{k} must be a number, got {}", v.get(k).unwrap_or(&Value::Null))))
        };
        Ok(Machine { ram_bytes: num("ramBytes")?, bandwidth_gbs: num("bandwidthGBs")? })
    }
}

/// Where a machine's bandwidth figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BandwidthSource {
    /// `APPLE_SKUS`' figure for the detected chip.
    Table,
    /// The caller's (`thisMachine(bandwidthGBs)`).
    Given,
    /// A guess (see `UNKNOWN_APPLE_GBS`, `OTHER_GBS`).
    Estimated,
}

impl BandwidthSource {
    pub fn as_str(self) -> &'static str {
        match self {
            BandwidthSource::Table => "table",
            BandwidthSource::Given => "given",
            BandwidthSource::Estimated => "estimated",
        }
    }
}

/// mlx-bun's `MachineSpec` (`name`, `ramBytes`, `bandwidthGBs`), with the chip and the
/// bandwidth's source added.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    pub name: String,
    #[serde(serialize_with = "super::as_js_number")]
    pub ram_bytes: f64,
    #[serde(rename = "bandwidthGBs", serialize_with = "super::as_js_number")]
    pub bandwidth_gbs: f64,
    /// "M4 Pro" on a Mac; the CPU's model name elsewhere; `None` when the system does not say.
    pub chip: Option<String>,
    pub bandwidth_source: BandwidthSource,
}

impl MachineSpec {
    pub fn machine(&self) -> Machine {
        Machine { ram_bytes: self.ram_bytes, bandwidth_gbs: self.bandwidth_gbs }
    }
}

/// The table's bandwidth for a chip name as sysctl gives it ("Apple M1 Max" or "M1 Max").
pub fn apple_bandwidth(chip: &str) -> Option<f64> {
    let name = chip.trim().strip_prefix("Apple ").unwrap_or(chip.trim());
    APPLE_SKUS.iter().find(|s| s.chip == name).map(|s| s.bandwidth_gbs)
}

/// mlx-bun's `thisMachine(bandwidthGBs?)`: this machine's RAM, its chip, and `bandwidth_gbs` or
/// the chip's figure (else an estimate).
pub fn this_machine(bandwidth_gbs: Option<f64>) -> Result<MachineSpec> {
    if let Some(b) = bandwidth_gbs.filter(|b| !(b.is_finite() && *b > 0.0)) {
        return Err(Error::option("bandwidthGBs", format!("must be a finite number > 0, got {b}")));
    }
    let chip = os::chip();
    let (bandwidth_gbs, bandwidth_source) = match (bandwidth_gbs, chip.as_deref().and_then(apple_bandwidth)) {
        (Some(b), _) => (b, BandwidthSource::Given),
        (None, Some(b)) => (b, BandwidthSource::Table),
        (None, None) => (if cfg!(target_os = "macos") { UNKNOWN_APPLE_GBS } else { OTHER_GBS }, BandwidthSource::Estimated),
    };
    Ok(MachineSpec { name: "this machine".into(), ram_bytes: os::ram_bytes()?, bandwidth_gbs, chip, bandwidth_source })
}

/// `MemTotal` of /proc/meminfo, in bytes (what Node's `os.totalmem()` reads).
pub fn mem_total(meminfo: &str) -> Option<f64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kb: f64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kb * 1024.0)
}

/// The first `model name` of /proc/cpuinfo.
pub fn cpu_model_name(cpuinfo: &str) -> Option<String> {
    let line = cpuinfo.lines().find(|l| l.split(':').next().is_some_and(|k| k.trim() == "model name"))?;
    let name = line.split_once(':')?.1.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(not(target_os = "macos"))]
mod os {
    use super::{cpu_model_name, mem_total};
    use crate::error::{Error, Result};

    pub fn ram_bytes() -> Result<f64> {
        let path = "/proc/meminfo";
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        mem_total(&text).ok_or_else(|| Error::Internal(format!("{path} has no MemTotal line")))
    }

    pub fn chip() -> Option<String> {
        cpu_model_name(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
    }
}

#[cfg(target_os = "macos")]
mod os {
    use std::ffi::CString;

    use crate::error::{Error, Result};

    /// A sysctl value's bytes (`sysctlbyname`: a size query, then the read).
    fn sysctl(name: &str) -> Option<Vec<u8>> {
        let name = CString::new(name).ok()?;
        let mut len: libc::size_t = 0;
        // SAFETY: `name` is a NUL-terminated string; a null buffer asks only for the size, and
        // the second call writes at most `len` bytes into a buffer of `len` bytes.
        unsafe {
            if libc::sysctlbyname(name.as_ptr(), std::ptr::null_mut(), &mut len, std::ptr::null_mut(), 0) != 0 {
                return None;
            }
            let mut buf = vec![0u8; len];
            if libc::sysctlbyname(name.as_ptr(), buf.as_mut_ptr().cast(), &mut len, std::ptr::null_mut(), 0) != 0 {
                return None;
            }
            buf.truncate(len);
            Some(buf)
        }
    }

    pub fn ram_bytes() -> Result<f64> {
        let bytes = sysctl("hw.memsize").ok_or_else(|| Error::Internal("sysctl hw.memsize failed".into()))?;
        let raw: [u8; 8] = bytes.as_slice().try_into().map_err(|_| Error::Internal("sysctl hw.memsize is not 8 bytes".into()))?;
        Ok(u64::from_ne_bytes(raw) as f64)
    }

    pub fn chip() -> Option<String> {
        let bytes = sysctl("machdep.cpu.brand_string")?;
        let text = String::from_utf8_lossy(&bytes);
        let name = text.trim_end_matches('\0').trim();
        (!name.is_empty()).then(|| name.strip_prefix("Apple ").unwrap_or(name).to_owned())
    }
}
