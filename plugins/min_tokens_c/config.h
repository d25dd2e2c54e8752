// Strict parsing of the `min_tokens` plugin's JSON config (no WASI, no libc I/O).
#ifndef MIN_TOKENS_CONFIG_H
#define MIN_TOKENS_CONFIG_H

#include <stddef.h>
#include <stdint.h>

// Smallest and largest accepted `min_tokens`.
#define MIN_TOKENS_LOWEST 1u
#define MIN_TOKENS_HIGHEST 1000000u

// Capacity of an error message buffer, terminating NUL included.
#define CONFIG_ERROR_CAP 256

// Parses `json` (`len` bytes, not NUL-terminated), which must be exactly one JSON
// object `{"min_tokens": N}` with N an integer in MIN_TOKENS_LOWEST..=MIN_TOKENS_HIGHEST.
// On success stores N in `*min_tokens` and returns 1. On failure writes a NUL-terminated
// message naming the field, the bound and the value given into `err` and returns 0.
int parse_min_tokens_config(const uint8_t *json, size_t len, uint32_t *min_tokens,
                            char err[CONFIG_ERROR_CAP]);

#endif
