//! The machine the benchmark runs on: CPU model, cores, caches, memory, and how busy the
//! CPUs are with other work.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;

/// CPU flags worth recording (the kernels' instruction sets).
const FLAGS: [&str; 9] = [
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
];

/// One cache level of cpu0.
#[derive(Debug, Clone, Serialize)]
pub struct Cache {
    pub level: u32,
    pub kind: String,
    pub bytes: u64,
    /// CPUs sharing it (`shared_cpu_list`).
    pub shared_cpus: String,
}

/// What the JSON records about the machine.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu_model: String,
    /// `processor` entries of /proc/cpuinfo.
    pub logical_cpus: usize,
    /// Distinct (physical id, core id) pairs, when /proc/cpuinfo has them.
    pub physical_cores: Option<usize>,
    /// CPUs this process may run on.
    pub available_parallelism: usize,
    pub flags: Vec<String>,
    pub caches: Vec<Cache>,
    pub mem_total_bytes: Option<u64>,
    pub kernel: Option<String>,
}

impl Machine {
    /// Reads /proc and /sys.
    pub fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |line: &str, key: &str| -> Option<String> {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        };
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| field(l, "model name"))
            .unwrap_or_else(|| "unknown".into());
        let logical_cpus = cpuinfo
            .lines()
            .filter(|l| field(l, "processor").is_some())
            .count();
        let mut cores = BTreeSet::new();
        let mut physical = String::new();
        for line in cpuinfo.lines() {
            if let Some(p) = field(line, "physical id") {
                physical = p;
            }
            if let Some(c) = field(line, "core id") {
                cores.insert((physical.clone(), c));
            }
        }
        let present: BTreeSet<&str> = cpuinfo
            .lines()
            .find_map(|l| field(l, "flags"))
            .map(|f| {
                f.split_whitespace()
                    .map(|s| FLAGS.iter().find(|&&x| x == s).copied().unwrap_or(""))
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let mem_total_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_owned();
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        });
        Machine {
            cpu_model,
            logical_cpus,
            physical_cores: (!cores.is_empty()).then_some(cores.len()),
            available_parallelism: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            flags: FLAGS
                .iter()
                .filter(|f| present.contains(*f))
                .map(|f| f.to_string())
                .collect(),
            caches: caches(),
            mem_total_bytes,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_owned()),
        }
    }

    /// The last-level (L3) cache, if reported.
    pub fn l3(&self) -> Option<&Cache> {
        self.caches.iter().find(|c| c.level == 3)
    }
}

/// Caches of cpu0 from /sys/devices/system/cpu/cpu0/cache/index*.
fn caches() -> Vec<Cache> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return out;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("index"))
        {
            continue;
        }
        let read = |f: &str| {
            std::fs::read_to_string(path.join(f))
                .ok()
                .map(|s| s.trim().to_owned())
        };
        let (Some(level), Some(size)) = (read("level"), read("size")) else {
            continue;
        };
        let (Ok(level), Some(bytes)) = (level.parse(), parse_size(&size)) else {
            continue;
        };
        out.push(Cache {
            level,
            kind: read("type").unwrap_or_default(),
            bytes,
            shared_cpus: read("shared_cpu_list").unwrap_or_default(),
        });
    }
    out.sort_by(|a, b| (a.level, &a.kind).cmp(&(b.level, &b.kind)));
    out
}

/// "32768K" / "1M" / "512" → bytes.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1024),
        'M' | 'm' => (&s[..s.len() - 1], 1024 * 1024),
        'G' | 'g' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok().map(|n| n * mult)
}

/// Fraction of all CPU time that was busy over one second (from `/proc/stat`), measured
/// while no engine runs: other work on the machine. Warns on stderr above 10 %, since
/// the figures are then skewed. `None` where `/proc/stat` cannot be read.
pub fn other_cpu_busy() -> Option<f64> {
    fn sample() -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = text
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let total: u64 = fields.iter().take(8).sum();
        let idle = fields.get(3)? + fields.get(4).unwrap_or(&0);
        Some((total, idle))
    }
    let (t0, i0) = sample()?;
    std::thread::sleep(Duration::from_secs(1));
    let (t1, i1) = sample()?;
    let total = t1.saturating_sub(t0);
    if total == 0 {
        return None;
    }
    let busy = 1.0 - i1.saturating_sub(i0) as f64 / total as f64;
    if busy > 0.1 {
        eprintln!(
            "inferd-bench: warning: the CPUs are {:.0} % busy with other work before \
             measuring; the figures are skewed",
            busy * 100.0
        );
    }
    Some(busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("64"), Some(64));
        assert_eq!(parse_size("x"), None);
    }
}
