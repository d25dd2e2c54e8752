//! What every inferd Rust plugin needs besides its bindings: a global allocator and a
//! panic handler for `no_std` WebAssembly (so the component imports no WASI), a cell for
//! per-instance state, and strict parsing of the JSON `config` string.
//!
//! A plugin links this crate with `use guest_support as _;` (or uses its items).
#![no_std]

extern crate alloc;

// Host builds (unit tests on x86_64) link `std`, which brings its own allocator and
// panic handler; the WebAssembly build gets the two below.
#[cfg(not(target_arch = "wasm32"))]
extern crate std;

use alloc::format;
use alloc::string::{String, ToString};
use core::cell::RefCell;
use serde_json::{Map, Value};

// `compiler_builtins` for wasm32-wasip2 leaves `memcpy`, `memmove`, `memset` and
// `memcmp` to libc: link them from the target's self-contained wasi-libc (`libc.a`).
// Only those pure functions are pulled in, so the component still imports no WASI.
#[cfg(target_arch = "wasm32")]
#[link(name = "c")]
extern "C" {}

/// The global allocator of every plugin: dlmalloc over `memory.grow`, no imports.
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// The canonical ABI's allocation entry point, through which the host writes call
/// arguments (strings, lists) into the plugin's memory. On wasm32-wasip2 it normally
/// comes from `std`; a `no_std` plugin must export it itself.
///
/// # Safety
///
/// Called by the host per the canonical ABI: `old_ptr`/`old_len` describe a block from an
/// earlier call (or `old_len == 0`), and `align` is a power of two.
#[cfg(target_arch = "wasm32")]
#[no_mangle]
pub unsafe extern "C" fn cabi_realloc(
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    use alloc::alloc::{alloc, realloc, Layout};
    if new_len == 0 {
        return align as *mut u8;
    }
    let ptr = if old_len == 0 {
        alloc(Layout::from_size_align_unchecked(new_len, align))
    } else {
        realloc(
            old_ptr,
            Layout::from_size_align_unchecked(old_len, align),
            new_len,
        )
    };
    if ptr.is_null() {
        core::arch::wasm32::unreachable();
    }
    ptr
}

/// A panic (including an out-of-memory abort) traps the instance; the daemon then fails
/// the request with `plugin_trap`. The message is dropped: there is no WASI to print it.
#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

/// Mutable per-instance state kept in a `static` (the daemon instantiates a plugin once
/// per request, so a global is per-request state).
pub struct Global<T>(RefCell<T>);

// SAFETY: a component instance runs on one thread (wasm32 without the threads proposal),
// so the `RefCell` is never shared across threads. Host unit tests must not touch a
// plugin's `static` from several threads.
unsafe impl<T> Sync for Global<T> {}

impl<T> Global<T> {
    /// A cell holding `value`.
    pub const fn new(value: T) -> Self {
        Self(RefCell::new(value))
    }

    /// Runs `f` with mutable access to the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.borrow_mut())
    }
}

/// Longest rendering of a rejected value in an error message, in bytes.
const SHOW_MAX: usize = 80;

/// Renders a JSON value for an error message, truncated to about 80 bytes.
pub fn show(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > SHOW_MAX {
        let mut end = SHOW_MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// A plugin's JSON `config`: an object whose field names have been checked.
pub struct Config(Map<String, Value>);

impl Config {
    /// Parses `config`, which must be a JSON object whose keys are all in `fields`.
    pub fn parse(config: &str, fields: &[&str]) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(config).map_err(|e| format!("config: not valid JSON ({e})"))?;
        let Value::Object(map) = value else {
            return Err(format!(
                "config: must be a JSON object, got {}",
                show(&value)
            ));
        };
        if let Some(unknown) = map.keys().find(|k| !fields.contains(&k.as_str())) {
            let expected = if fields.is_empty() {
                String::from("this plugin takes no fields")
            } else {
                format!("known fields: {}", fields.join(", "))
            };
            return Err(format!("{unknown}: unknown field ({expected})"));
        }
        Ok(Self(map))
    }

    /// The raw value of `field`, if given.
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field)
    }

    /// An optional integer field in `min..=max`.
    pub fn integer(&self, field: &str, min: u64, max: u64) -> Result<Option<u64>, String> {
        let Some(value) = self.get(field) else {
            return Ok(None);
        };
        match value.as_u64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "{field}: must be an integer from {min} to {max}, got {}",
                show(value)
            )),
        }
    }

    /// An optional number field in the half-open range `(min_exclusive, max]`.
    pub fn number(&self, field: &str, min_exclusive: f64, max: f64) -> Result<Option<f64>, String> {
        let Some(value) = self.get(field) else {
            return Ok(None);
        };
        match value.as_f64() {
            Some(x) if x > min_exclusive && x <= max => Ok(Some(x)),
            _ => Err(format!(
                "{field}: must be a number in ({min_exclusive}, {max}], got {}",
                show(value)
            )),
        }
    }

    /// An optional boolean field.
    pub fn boolean(&self, field: &str) -> Result<Option<bool>, String> {
        let Some(value) = self.get(field) else {
            return Ok(None);
        };
        value
            .as_bool()
            .map(Some)
            .ok_or_else(|| format!("{field}: must be true or false, got {}", show(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_fields_and_non_objects() {
        let err = Config::parse(r#"{"ngram": 3, "nope": 1}"#, &["ngram"])
            .err()
            .unwrap();
        assert_eq!(err, "nope: unknown field (known fields: ngram)");
        let err = Config::parse("[]", &["ngram"]).err().unwrap();
        assert_eq!(err, "config: must be a JSON object, got []");
        assert!(Config::parse("{", &[]).is_err());
        assert!(Config::parse("{}", &[]).is_ok());
    }

    #[test]
    fn checks_ranges_and_types() {
        let c = Config::parse(
            r#"{"n": 40, "x": 0, "b": 1, "s": "3"}"#,
            &["n", "x", "b", "s"],
        )
        .unwrap();
        assert_eq!(
            c.integer("n", 2, 32).err().unwrap(),
            "n: must be an integer from 2 to 32, got 40"
        );
        assert_eq!(
            c.integer("s", 2, 32).err().unwrap(),
            "s: must be an integer from 2 to 32, got \"3\""
        );
        assert_eq!(
            c.number("x", 0.0, 100.0).err().unwrap(),
            "x: must be a number in (0, 100], got 0"
        );
        assert_eq!(
            c.boolean("b").err().unwrap(),
            "b: must be true or false, got 1"
        );
        assert_eq!(c.integer("missing", 0, 1), Ok(None));
    }
}
