//! The adapter registry: names to files, resident weights, leases, counters.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use crate::model::lora::{LoraAdapter, LoraBase, LoraError};

/// What a request's K/V depend on besides the base model: the adapter file's content
/// and the request's scale. Enters the root of the prefix hash chain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdapterKey {
    /// SHA-256 of the adapter's files (a GGUF file; a PEFT directory's
    /// `adapter_config.json` then `adapter_model.safetensors`).
    pub fingerprint: [u8; 32],
    /// The request's `lora_scale`.
    pub scale: f32,
}

/// A registered adapter as `/v1/models` and metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterInfo {
    /// The name requests use.
    pub name: String,
    /// Its file or directory.
    pub path: PathBuf,
    /// Rank `r`.
    pub rank: usize,
    /// Whether its weights are loaded now.
    pub resident: bool,
    /// Requests queued or running with it.
    pub active: usize,
    /// Requests that asked for an adapter of this name since start (across unloads).
    pub requests_total: u64,
}

/// Why an unload was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnloadError {
    /// No adapter of that name (HTTP 404).
    #[error("no LoRA adapter named {0:?} is loaded")]
    NotFound(String),
    /// Requests still use it (HTTP 409).
    #[error("LoRA adapter {name:?} is in use by {active} request(s); retry when they finish")]
    InUse {
        /// The adapter.
        name: String,
        /// Requests queued or running with it.
        active: usize,
    },
}

/// Loads to start: the registry and `(name, path)` each.
pub type AdapterLoads = (Arc<AdapterRegistry>, Vec<(String, PathBuf)>);

/// What [`AdapterRegistry::residency`] found for a waiting request.
#[derive(Debug, Clone)]
pub enum Residency {
    /// Loaded: the request may run.
    Ready(Arc<LoraAdapter>),
    /// Being loaded (or to be loaded once a slot frees): keep waiting.
    Pending,
    /// No longer registered (unloaded, or its file failed to load): fail the request
    /// with this message.
    Gone(String),
}

#[derive(Debug)]
struct Entry {
    path: PathBuf,
    fingerprint: [u8; 32],
    rank: usize,
    resident: Option<Arc<LoraAdapter>>,
    /// A load is running or queued.
    loading: bool,
    /// Requests holding a lease.
    active: usize,
    /// Logical time of the last admission (least recently used goes first).
    last_used: u64,
    /// Named by `[lora] adapters` (SIGHUP adds and removes those), not by the API.
    configured: bool,
}

#[derive(Debug, Default)]
struct Inner {
    entries: BTreeMap<String, Entry>,
    /// Names whose load the scheduler asked for and nobody has started.
    to_load: Vec<String>,
    clock: u64,
    /// Why a name's last load failed (the scheduler fails its waiting requests).
    failed: BTreeMap<String, String>,
    /// Requests per adapter name since start; kept when an adapter is unloaded, so a
    /// reloaded name counts on (the metrics' counter must not go back).
    served: BTreeMap<String, u64>,
}

/// The daemon's adapters (see the module docs). Shared by the server (names, load,
/// unload, listing) and the scheduler (residency, leases).
#[derive(Debug)]
pub struct AdapterRegistry {
    base: LoraBase,
    /// The base model's name (`model` in OpenAI requests): no adapter may take it.
    base_name: String,
    /// Adapters resident at once (`lora.max_loras`).
    max_loras: usize,
    /// Largest rank accepted (`lora.max_rank`).
    max_rank: usize,
    inner: Mutex<Inner>,
}

/// A request's hold on an adapter: while any exists the adapter is not unloaded.
/// Released on drop.
#[derive(Debug)]
pub struct AdapterLease {
    registry: Arc<AdapterRegistry>,
    name: String,
    key: AdapterKey,
}

impl AdapterLease {
    /// The adapter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the request's K/V depend on.
    pub fn key(&self) -> AdapterKey {
        self.key
    }

    /// The registry it came from.
    pub fn registry(&self) -> &Arc<AdapterRegistry> {
        &self.registry
    }
}

impl Clone for AdapterLease {
    fn clone(&self) -> Self {
        if let Some(e) = self.registry.lock().entries.get_mut(&self.name) {
            e.active += 1;
        }
        Self {
            registry: self.registry.clone(),
            name: self.name.clone(),
            key: self.key,
        }
    }
}

impl Drop for AdapterLease {
    fn drop(&mut self) {
        if let Some(e) = self.registry.lock().entries.get_mut(&self.name) {
            e.active = e.active.saturating_sub(1);
        }
    }
}

/// SHA-256 of an adapter's files, streamed.
///
/// # Errors
/// A file cannot be read.
pub fn fingerprint(path: &Path) -> std::io::Result<[u8; 32]> {
    let files = if path.is_dir() {
        vec![
            path.join("adapter_config.json"),
            path.join("adapter_model.safetensors"),
        ]
    } else {
        vec![path.to_path_buf()]
    };
    let mut h = Sha256::new();
    for f in files {
        let mut file = std::fs::File::open(&f)?;
        std::io::copy(&mut file, &mut h)?;
    }
    Ok(h.finalize().into())
}

/// Names an adapter may have: 1 to 128 characters of letters, digits and `-_.:/@+`
/// (what OpenAI model ids and vLLM adapter names use).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().count() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@+".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "lora_name must be 1 to 128 characters of letters, digits and -_.:/@+ (got {})",
            crate::model::source::quote(name)
        ))
    }
}

impl AdapterRegistry {
    /// An empty registry for adapters of `base`.
    pub fn new(base: LoraBase, max_loras: usize, max_rank: usize) -> Self {
        Self {
            base,
            base_name: String::new(),
            max_loras: max_loras.max(1),
            max_rank,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuses adapter names equal to `name`, the base model's (requests naming it mean
    /// no adapter).
    pub fn with_base_name(mut self, name: &str) -> Self {
        self.base_name = name.to_string();
        self
    }

    /// Whether `name` may be given to a new adapter: a well-formed name ([`check_name`])
    /// that is neither the base model's nor taken. The message starts with `lora_name`.
    ///
    /// # Errors
    /// Why not.
    pub fn check_new_name(&self, name: &str) -> Result<(), String> {
        check_name(name)?;
        if name == self.base_name {
            return Err(format!(
                "lora_name {} is the base model's name (requests naming it get no adapter)",
                crate::model::source::quote(name)
            ));
        }
        if self.lock().entries.contains_key(name) {
            return Err(format!(
                "lora_name {}: an adapter of this name is already loaded (unload it first)",
                crate::model::source::quote(name)
            ));
        }
        Ok(())
    }

    /// `lora.max_loras`.
    pub fn max_loras(&self) -> usize {
        self.max_loras
    }

    /// Loads `path` as adapter `name` (file reading and checks: run it off the async
    /// executor), keeping it resident when a slot is free.
    ///
    /// # Errors
    /// The name is taken or malformed, or the adapter does not load or fit (the
    /// message names adapter, file and value).
    pub fn register(&self, name: &str, path: &Path) -> Result<AdapterInfo, LoraError> {
        self.register_as(name, path, false)
    }

    /// [`Self::register`] for an adapter of `[lora] adapters`.
    ///
    /// # Errors
    /// As [`Self::register`].
    pub fn register_configured(&self, name: &str, path: &Path) -> Result<AdapterInfo, LoraError> {
        self.register_as(name, path, true)
    }

    /// Names of the adapters registered from `[lora] adapters`.
    pub fn configured(&self) -> Vec<String> {
        let g = self.lock();
        g.entries
            .iter()
            .filter(|(_, e)| e.configured)
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn register_as(
        &self,
        name: &str,
        path: &Path,
        configured: bool,
    ) -> Result<AdapterInfo, LoraError> {
        let err = |message: String| LoraError {
            adapter: name.into(),
            message,
        };
        self.check_new_name(name).map_err(err)?;
        let adapter = LoraAdapter::load(name, path, &self.base, Some(self.max_rank))?;
        let fp = fingerprint(path)
            .map_err(|e| err(format!("{}: cannot read it: {e}", path.display())))?;
        let mut g = self.lock();
        if g.entries.contains_key(name) {
            return Err(err(format!(
                "lora_name {}: an adapter of this name is already loaded (unload it first)",
                crate::model::source::quote(name)
            )));
        }
        let resident = g.entries.values().filter(|e| e.resident.is_some()).count();
        let rank = adapter.rank;
        g.clock += 1;
        let now = g.clock;
        g.failed.remove(name);
        g.entries.insert(
            name.to_string(),
            Entry {
                path: path.to_path_buf(),
                fingerprint: fp,
                rank,
                resident: (resident < self.max_loras).then(|| Arc::new(adapter)),
                loading: false,
                active: 0,
                last_used: now,
                configured,
            },
        );
        drop(g);
        Ok(self.info(name).unwrap_or(AdapterInfo {
            name: name.into(),
            path: path.into(),
            rank,
            resident: false,
            active: 0,
            requests_total: 0,
        }))
    }

    /// Removes adapter `name`.
    ///
    /// # Errors
    /// [`UnloadError::NotFound`]; [`UnloadError::InUse`] while requests hold it.
    pub fn unregister(&self, name: &str) -> Result<(), UnloadError> {
        let mut g = self.lock();
        let Some(e) = g.entries.get(name) else {
            return Err(UnloadError::NotFound(name.into()));
        };
        if e.active > 0 {
            return Err(UnloadError::InUse {
                name: name.into(),
                active: e.active,
            });
        }
        g.entries.remove(name);
        g.to_load.retain(|n| n != name);
        Ok(())
    }

    /// A lease on adapter `name` for one request (counted in `requests_total`), or
    /// `None` when no such adapter is registered.
    pub fn lease(self: &Arc<Self>, name: &str, scale: f32) -> Option<AdapterLease> {
        let mut g = self.lock();
        let e = g.entries.get_mut(name)?;
        e.active += 1;
        let key = AdapterKey {
            fingerprint: e.fingerprint,
            scale,
        };
        *g.served.entry(name.to_string()).or_default() += 1;
        Some(AdapterLease {
            registry: self.clone(),
            name: name.into(),
            key,
        })
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().entries.contains_key(name)
    }

    /// Every registered adapter, by name.
    pub fn list(&self) -> Vec<AdapterInfo> {
        let g = self.lock();
        g.entries.iter().map(|(n, e)| info_of(&g, n, e)).collect()
    }

    /// One adapter's entry.
    pub fn info(&self, name: &str) -> Option<AdapterInfo> {
        let g = self.lock();
        g.entries.get(name).map(|e| info_of(&g, name, e))
    }

    /// Requests per adapter name since start, loaded now or not (for the metrics'
    /// counter).
    pub fn requests_by_name(&self) -> Vec<(String, u64)> {
        let g = self.lock();
        g.served.iter().map(|(n, &c)| (n.clone(), c)).collect()
    }

    /// The adapter of a waiting request, to be admitted now if resident. Otherwise a
    /// load is queued ([`Self::take_loads`]) when a slot is free or an idle resident
    /// adapter (none of `in_use`, the adapters of running requests) can be evicted,
    /// least recently used first.
    pub fn residency(&self, name: &str, in_use: &HashSet<String>) -> Residency {
        let mut g = self.lock();
        if let Some(msg) = g.failed.get(name) {
            return Residency::Gone(msg.clone());
        }
        g.clock += 1;
        let now = g.clock;
        let Some(e) = g.entries.get_mut(name) else {
            return Residency::Gone(format!("LoRA adapter {name:?} was unloaded"));
        };
        if let Some(a) = &e.resident {
            e.last_used = now;
            return Residency::Ready(a.clone());
        }
        if e.loading {
            return Residency::Pending;
        }
        let taken = g
            .entries
            .values()
            .filter(|e| e.resident.is_some() || e.loading)
            .count();
        if taken >= self.max_loras {
            let victim = g
                .entries
                .iter()
                .filter(|(n, e)| e.resident.is_some() && !in_use.contains(*n))
                .min_by_key(|(_, e)| e.last_used)
                .map(|(n, _)| n.clone());
            match victim {
                Some(v) => {
                    if let Some(e) = g.entries.get_mut(&v) {
                        e.resident = None;
                    }
                    tracing::info!(evicted = %v, for_adapter = %name, "LoRA: evicted an idle adapter");
                }
                None => return Residency::Pending,
            }
        }
        if let Some(e) = g.entries.get_mut(name) {
            e.loading = true;
        }
        g.to_load.push(name.to_string());
        Residency::Pending
    }

    /// Loads asked for by [`Self::residency`]: `(name, path)` each, to run with
    /// [`Self::load_resident`] off the scheduler's thread.
    pub fn take_loads(&self) -> Vec<(String, PathBuf)> {
        let mut g = self.lock();
        let names = std::mem::take(&mut g.to_load);
        names
            .into_iter()
            .filter_map(|n| g.entries.get(&n).map(|e| (n.clone(), e.path.clone())))
            .collect()
    }

    /// Loads `name`'s weights from `path` and makes it resident (file reading: not on
    /// the async executor). A failure (the file changed or vanished since it was
    /// registered) unregisters it and is returned, for failing its waiting requests.
    ///
    /// # Errors
    /// The adapter no longer loads, or its file's content changed (its cached prefixes
    /// would be wrong).
    pub fn load_resident(&self, name: &str, path: &Path) -> Result<(), LoraError> {
        let loaded = LoraAdapter::load(name, path, &self.base, Some(self.max_rank)).and_then(|a| {
            let fp = fingerprint(path).map_err(|e| LoraError {
                adapter: name.into(),
                message: format!("{}: cannot read it: {e}", path.display()),
            })?;
            Ok((a, fp))
        });
        let mut g = self.lock();
        let Some(e) = g.entries.get_mut(name) else {
            return Ok(()); // unregistered meanwhile
        };
        e.loading = false;
        match loaded {
            Ok((a, fp)) if fp == e.fingerprint => {
                e.resident = Some(Arc::new(a));
                Ok(())
            }
            other => {
                let err = match other {
                    Err(e) => e,
                    Ok(_) => LoraError {
                        adapter: name.into(),
                        message: format!(
                            "{} changed since it was loaded; load it again under a new name",
                            path.display()
                        ),
                    },
                };
                g.entries.remove(name);
                g.failed.insert(name.to_string(), err.to_string());
                Err(err)
            }
        }
    }

    /// Names of the resident adapters (the tests' view of residency).
    #[cfg(test)]
    pub fn resident_names(&self) -> Vec<String> {
        let g = self.lock();
        g.entries
            .iter()
            .filter(|(_, e)| e.resident.is_some())
            .map(|(n, _)| n.clone())
            .collect()
    }
}

fn info_of(g: &Inner, name: &str, e: &Entry) -> AdapterInfo {
    AdapterInfo {
        name: name.into(),
        path: e.path.clone(),
        rank: e.rank,
        resident: e.resident.is_some(),
        active: e.active,
        requests_total: g.served.get(name).copied().unwrap_or(0),
    }
}
