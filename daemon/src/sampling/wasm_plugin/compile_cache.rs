//! [`CompileCache`]: plugin components compiled once per file content and engine, kept on
//! disk (`plugins.compile_cache`), so that a restart or a SIGHUP reload does not compile
//! them again. Compiling an interpreter component (componentize-py's is about 18 MB) takes
//! 10–16 s on 2 cores; loading its cached machine code takes well under one.
//!
//! An entry is `<key>.cwasm`, where the key is the SHA-256 of the component's bytes and
//! of wasmtime's [`Engine::precompile_compatibility_hash`] (so another wasmtime version
//! or engine configuration misses). Its first 32 bytes are the SHA-256 of the rest,
//! checked before the machine code is used: a truncated or damaged entry is compiled
//! again and rewritten. Entries are written to a temporary file and renamed, so
//! daemons sharing the directory never read a partial one. The directory must be as
//! trusted as `plugins.dir` itself: its files are native code the daemon runs.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Where compiled components are kept; `None` compiles every time.
#[derive(Debug, Clone, Default)]
pub struct CompileCache {
    dir: Option<PathBuf>,
}

/// How [`CompileCache::load`] got its component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Compiled (no cache, a miss, or a damaged entry).
    Compiled,
    /// Loaded from a cache entry.
    Hit,
}

impl CompileCache {
    /// A cache in `dir` (created on the first write), or none for `None`.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }

    /// The component in `path`, from the cache when an intact entry exists, else compiled
    /// (and stored; a failed write is logged, not an error).
    ///
    /// # Errors
    /// The file cannot be read or is not a valid component.
    pub fn load(&self, engine: &Engine, path: &Path) -> Result<(Component, CacheOutcome), String> {
        let wasm = std::fs::read(path).map_err(|e| format!("not readable: {e}"))?;
        let Some(dir) = &self.dir else {
            return compile(engine, &wasm).map(|c| (c, CacheOutcome::Compiled));
        };
        let entry = dir.join(format!("{}.cwasm", key(engine, &wasm)));
        if let Some(component) = read_entry(engine, &entry) {
            return Ok((component, CacheOutcome::Hit));
        }
        let component = compile(engine, &wasm)?;
        if let Err(e) = write_entry(dir, &entry, &component) {
            tracing::warn!(
                cache = %dir.display(),
                error = %e,
                "plugins.compile_cache: entry not written"
            );
        }
        Ok((component, CacheOutcome::Compiled))
    }
}

fn compile(engine: &Engine, wasm: &[u8]) -> Result<Component, String> {
    Component::new(engine, wasm).map_err(|e| format!("not loadable: {e:#}"))
}

/// Hex SHA-256 of the component's bytes and the engine's compatibility hash.
fn key(engine: &Engine, wasm: &[u8]) -> String {
    let mut compat = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut compat);
    let mut h = Sha256::new();
    h.update(compat.finish().to_le_bytes());
    h.update(wasm);
    format!("{:x}", h.finalize())
}

fn read_entry(engine: &Engine, entry: &Path) -> Option<Component> {
    let bytes = std::fs::read(entry).ok()?;
    let (digest, code) = bytes.split_at_checked(32)?;
    if Sha256::digest(code).as_slice() != digest {
        tracing::warn!(entry = %entry.display(), "plugins.compile_cache: damaged entry, compiling again");
        return None;
    }
    // SAFETY: `code` is what `Component::serialize` wrote for this component under an
    // engine with the same compatibility hash (the key), unchanged since (the digest).
    // wasmtime checks its own header (version, target, configuration) again and fails
    // rather than loads on any mismatch. The directory is trusted like `plugins.dir`.
    match unsafe { Component::deserialize(engine, code) } {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(entry = %entry.display(), error = %e, "plugins.compile_cache: entry not usable, compiling again");
            None
        }
    }
}

fn write_entry(dir: &Path, entry: &Path, component: &Component) -> std::io::Result<()> {
    let code = component.serialize().map_err(std::io::Error::other)?;
    std::fs::create_dir_all(dir)?;
    let name = entry
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{name}.{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut bytes = Sha256::digest(&code).to_vec();
    bytes.extend_from_slice(&code);
    let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, entry));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        let mut cfg = wasmtime::Config::new();
        cfg.wasm_component_model(true);
        Engine::new(&cfg).expect("engine")
    }

    #[test]
    fn a_second_load_hits_and_a_damaged_entry_is_compiled_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.wasm");
        std::fs::write(&file, wat::parse_str("(component)").expect("wat")).expect("write");
        let cache = CompileCache::new(Some(dir.path().join("cache")));
        let e = engine();
        assert_eq!(
            cache.load(&e, &file).expect("load").1,
            CacheOutcome::Compiled
        );
        assert_eq!(cache.load(&e, &file).expect("load").1, CacheOutcome::Hit);
        let entries: Vec<PathBuf> = std::fs::read_dir(dir.path().join("cache"))
            .expect("cache dir")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        // Flip one byte of the machine code: the digest no longer matches.
        let mut bytes = std::fs::read(&entries[0]).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&entries[0], &bytes).expect("write");
        assert_eq!(
            cache.load(&e, &file).expect("load").1,
            CacheOutcome::Compiled
        );
        assert_eq!(cache.load(&e, &file).expect("load").1, CacheOutcome::Hit);
        // Another component content is another entry; no cache compiles every time.
        std::fs::write(
            &file,
            wat::parse_str("(component (core module))").expect("wat"),
        )
        .expect("write");
        assert_eq!(
            cache.load(&e, &file).expect("load").1,
            CacheOutcome::Compiled
        );
        let none = CompileCache::new(None);
        assert_eq!(
            none.load(&e, &file).expect("load").1,
            CacheOutcome::Compiled
        );
        assert_eq!(
            none.load(&e, &file).expect("load").1,
            CacheOutcome::Compiled
        );
        assert!(cache
            .load(&e, &dir.path().join("missing.wasm"))
            .expect_err("missing")
            .starts_with("not readable"));
    }
}
