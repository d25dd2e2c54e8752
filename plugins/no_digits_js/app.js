// no_digits_js: a context processor written in JavaScript (built with ComponentizeJS by
// scripts/build-plugins-js.sh; world `context-processor-plugin`, so it never receives the
// logits row and a step costs only its own logic plus the host call).
//
// What it does: once the generated text contains the string `after`, bans every
// non-control token whose bytes contain an ASCII digit (0-9); until then, `keep`. The
// generated text is the concatenation of the raw bytes of the generated tokens, control
// tokens (e.g. `<|im_end|>`) excluded: they are not text, add no bytes (so `after` split
// around one still matches) and are never banned. The match is on bytes, so `after` may
// end in the middle of a multi-byte character or span a token boundary.
//
// Config (JSON object, unknown fields refused):
//   {}                    ban digits from the first generated token on
//   {"after": "Answer:"}  ban digits once the generated text contains "Answer:"
//                         (a string of 1 to 256 bytes in UTF-8)
// Errors name the field, the bound and the value, e.g.
//   after: must be a string of 1 to 256 bytes, got 7
//
// Cost:
// - configure: one `vocab-bytes` call (the whole vocabulary in one buffer) and one pass
//   over it, building the ban list (a Uint32Array of the digit tokens that are not
//   control tokens), the control set, and the KMP failure table of `after`.
// - process: the host passes `ctx.generated` (all generated ids, not only the new one);
//   only the ids not seen at the previous step are read. Their bytes go through the KMP
//   matcher of `after` one byte at a time, whose state (how many bytes of `after` the
//   text currently ends with) carries across steps and tokens, so a step costs O(bytes of
//   the new tokens), independent of the text length and the vocabulary. After the
//   trigger a step returns the precomputed ban list (no per-step allocation here; the
//   bindings copy it into the result, O(number of digit tokens)).
// - Per-request state lives in module globals: the daemon instantiates the plugin once
//   per request.

import { vocabBytes, specialTokens } from 'inferd:plugin/host@0.1.1';

const MAX_AFTER_BYTES = 256;

let banList = new Uint32Array(0); // digit tokens that are not control tokens, ascending
let isControl = new Uint8Array(0); // by token id
let vocab = null; // { bytes, offsets } from vocab-bytes
let after = null; // Uint8Array, or null = triggered from the start
let fail = null; // KMP failure table of `after` (Int32Array)
let matched = 0; // bytes of `after` that the generated text currently ends with
let seen = 0; // generated ids already fed to the matcher
let triggered = false;

/// A config value as error messages show it: JSON, cut at 64 characters (as the Rust
/// plugins' guest-support `show`), with a string's length in bytes.
function describe(value) {
    let text = JSON.stringify(value);
    if (text === undefined) text = String(value);
    if (text.length > 64) text = `${text.slice(0, 64)}…`;
    if (typeof value === 'string') text += ` (${new TextEncoder().encode(value).length} bytes)`;
    return text;
}

/// Parses and validates the config; throws a string (the `err` of configure).
function parseConfig(config) {
    let cfg;
    try {
        cfg = JSON.parse(config);
    } catch (e) {
        throw `config: not valid JSON (${e.message})`;
    }
    if (typeof cfg !== 'object' || cfg === null || Array.isArray(cfg)) {
        throw `config: must be a JSON object, got ${describe(cfg)}`;
    }
    for (const key of Object.keys(cfg)) {
        if (key !== 'after') throw `${key}: unknown field (known fields: after)`;
    }
    if (!('after' in cfg)) return null;
    const value = cfg.after;
    const bytes = typeof value === 'string' ? new TextEncoder().encode(value) : null;
    if (bytes === null || bytes.length < 1 || bytes.length > MAX_AFTER_BYTES) {
        throw `after: must be a string of 1 to ${MAX_AFTER_BYTES} bytes, got ${describe(value)}`;
    }
    return bytes;
}

/// KMP failure table: fail[i] = length of the longest proper border of pattern[0..=i].
function failureTable(pattern) {
    const table = new Int32Array(pattern.length);
    for (let i = 1, k = 0; i < pattern.length; i++) {
        while (k > 0 && pattern[i] !== pattern[k]) k = table[k - 1];
        if (pattern[i] === pattern[k]) k++;
        table[i] = k;
    }
    return table;
}

/// Feeds the bytes of token `id` to the matcher; returns true once `after` is found.
function feedToken(id) {
    const { bytes, offsets } = vocab;
    const end = offsets[id + 1];
    let k = matched;
    for (let j = offsets[id]; j < end; j++) {
        const b = bytes[j];
        while (k > 0 && b !== after[k]) k = fail[k - 1];
        if (b === after[k]) k++;
        if (k === after.length) {
            matched = k;
            return true;
        }
    }
    matched = k;
    return false;
}

export const contextProcessor = {
    info() {
        return {
            name: 'no_digits_js',
            version: '0.1.0',
            description: 'Bans tokens containing ASCII digits once the text contains `after` (JavaScript)',
        };
    },

    configure(config, _seed) {
        after = parseConfig(config);
        fail = after === null ? null : failureTable(after);
        matched = 0;
        seen = 0;
        triggered = after === null;

        vocab = vocabBytes();
        const { bytes, offsets } = vocab;
        const n = offsets.length - 1;
        isControl = new Uint8Array(n);
        for (const id of specialTokens().control) {
            if (id < n) isControl[id] = 1;
        }
        const ban = [];
        for (let id = 0; id < n; id++) {
            if (isControl[id]) continue;
            for (let j = offsets[id], end = offsets[id + 1]; j < end; j++) {
                const b = bytes[j];
                if (b >= 0x30 && b <= 0x39) {
                    ban.push(id);
                    break;
                }
            }
        }
        banList = Uint32Array.from(ban);
    },

    process(ctx) {
        if (!triggered) {
            const generated = ctx.generated;
            const n = vocab.offsets.length - 1;
            for (let i = seen; i < generated.length; i++) {
                const id = generated[i];
                if (id >= n || isControl[id]) continue;
                if (feedToken(id)) {
                    triggered = true;
                    break;
                }
            }
            seen = generated.length;
        }
        if (!triggered || banList.length === 0) return { tag: 'keep' };
        return { tag: 'ban', val: banList };
    },
};
