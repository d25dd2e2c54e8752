// js_probe: a TEST-ONLY fixture written in JavaScript (ComponentizeJS, world
// `logits-processor-plugin`, built by scripts/build-plugins-js.sh into the test-only
// output). It exercises what a JavaScript plugin can do inside the daemon's sandbox:
// read the whole logits row, loop forever, grow memory, throw, return `err`, and probe
// the deny-by-default WASI (clocks, random, stdio, fetch). Not meant for users.
//
// Config, one mode at a time (unknown fields, several modes or bad values are refused
// with an `err` naming the problem):
//   {}                  process answers `keep`
//   {"scan": true}      process reads every logit and answers `bias` with the argmax and
//                       a bias of 0: [{token: argmax, bias: 0}] (first index on ties;
//                       -inf logits are skipped; `keep` if every logit is -inf)
//   {"spin": true}      process loops forever (the daemon's call deadline must stop it)
//   {"alloc_mb": N}     every process call allocates N MiB (integer 1 to 2048) as a new
//                       Uint8Array, writes every byte, keeps it in a module-level array
//                       (so memory only grows) and answers `keep`
//   {"throw": true}     process throws new Error("js_probe: thrown on purpose"). Only a
//                       thrown string becomes the `err` variant; ComponentizeJS fails to
//                       encode an Error object as the error string, prints `expected a
//                       string, received [object]` and a stack on stderr, and aborts: a
//                       trap (`plugin_trap`), not `err`
//   {"err": "msg"}      process returns the `err` variant with "msg" (a string of 1 to
//                       1024 bytes); ComponentizeJS maps a thrown non-Error value of the
//                       result's error type (here a string) to `err`
//   {"fetch": true}     process calls fetch('http://127.0.0.1/'). ComponentizeJS 0.23 keeps
//                       `fetch` defined when built with http disabled, but the wasi:http
//                       functions behind it are stubbed with `unreachable`: the call
//                       traps (no exception the plugin could catch, no import to refuse)
//   {"report": true}    configure rejects the config with one line:
//       wall=<Math.floor(Date.now()/1000)> mono=<ms performance.now() advanced across a
//       busy 1000-iteration loop, or 'none'> random=<16 hex digits from
//       crypto.getRandomValues(new Uint32Array(2)), or the error's name>
//       math=<Math.random().toFixed(17)> fetch=<'none' when fetch is undefined, else
//       `typeof fetch`, i.e. 'function': it is not called, see `fetch` below>
//     and writes `js_probe: hello on stdout` (console.log) and `js_probe: hello on
//     stderr` (console.error), which the daemon logs as the plugin's stdout/stderr.
//
// Cost: the logits arrive as a Float32Array that the bindings copy out of the component's
// linear memory on every call (vocab-size floats); only `scan` reads it.

const MAX_ALLOC_MB = 2048;
const MAX_ERR_BYTES = 1024;

let mode = 'keep';
let allocMb = 0;
let errMessage = '';
const kept = []; // alloc_mb: every allocation, so none is collected

function describe(value) {
    let text = JSON.stringify(value);
    if (text === undefined) text = String(value);
    return text.length > 64 ? `${text.slice(0, 61)}...` : text;
}

function errorName(e) {
    return e && typeof e === 'object' && typeof e.name === 'string' ? e.name : typeof e;
}

function report() {
    const wall = Math.floor(Date.now() / 1000);

    let mono = 'none';
    if (typeof performance !== 'undefined' && typeof performance.now === 'function') {
        const start = performance.now();
        let x = 0;
        for (let i = 0; i < 1000; i++) x = (x * 31 + i) | 0;
        const elapsed = performance.now() - start;
        mono = `${elapsed}`;
        if (x === 42) mono += '!'; // keeps the loop from being optimised away
    }

    let random;
    try {
        const words = crypto.getRandomValues(new Uint32Array(2));
        random = Array.from(words, (w) => w.toString(16).padStart(8, '0')).join('');
    } catch (e) {
        random = errorName(e);
    }

    const math = Math.random().toFixed(17);

    // Not called here: with the `http` feature disabled ComponentizeJS still defines
    // fetch, but stubs the wasi:http functions it would call with `unreachable`, so
    // calling it traps the instance instead of throwing (see the `fetch` mode).
    const fetchResult = typeof fetch === 'undefined' ? 'none' : typeof fetch;

    console.log('js_probe: hello on stdout');
    console.error('js_probe: hello on stderr');
    return `wall=${wall} mono=${mono} random=${random} math=${math} fetch=${fetchResult}`;
}

/// Parses the config and sets the mode; throws a string (the `err` of configure).
function parseConfig(config) {
    let cfg;
    try {
        cfg = JSON.parse(config);
    } catch (e) {
        throw `config must be a JSON object (not valid JSON: ${e.message})`;
    }
    if (typeof cfg !== 'object' || cfg === null || Array.isArray(cfg)) {
        throw `config must be a JSON object (got ${describe(cfg)})`;
    }
    const keys = Object.keys(cfg);
    if (keys.length === 0) return;
    if (keys.length > 1) {
        throw `config must have at most one field, one of scan, spin, alloc_mb, throw, err, fetch, report (got ${keys.join(', ')})`;
    }
    const key = keys[0];
    const value = cfg[key];
    switch (key) {
        case 'scan':
        case 'spin':
        case 'throw':
        case 'fetch':
        case 'report':
            if (value !== true) throw `${key} must be true (got ${describe(value)})`;
            if (key === 'report') throw report();
            mode = key;
            return;
        case 'alloc_mb':
            if (!Number.isInteger(value) || value < 1 || value > MAX_ALLOC_MB) {
                throw `alloc_mb must be an integer from 1 to ${MAX_ALLOC_MB} (got ${describe(value)})`;
            }
            mode = key;
            allocMb = value;
            return;
        case 'err': {
            const n = typeof value === 'string' ? new TextEncoder().encode(value).length : -1;
            if (n < 1 || n > MAX_ERR_BYTES) {
                throw `err must be a string of 1 to ${MAX_ERR_BYTES} bytes (got ${describe(value)})`;
            }
            mode = key;
            errMessage = value;
            return;
        }
        default:
            throw `unknown field ${JSON.stringify(key)} (allowed: scan, spin, alloc_mb, throw, err, fetch, report)`;
    }
}

export const logitsProcessor = {
    info() {
        return {
            name: 'js_probe',
            version: '0.1.0',
            description: 'Test fixture: probes the sandbox from JavaScript (ComponentizeJS)',
        };
    },

    configure(config, _seed) {
        mode = 'keep';
        parseConfig(config);
    },

    process(_ctx, logits) {
        switch (mode) {
            case 'scan': {
                let best = -Infinity;
                let argmax = -1;
                for (let i = 0; i < logits.length; i++) {
                    if (logits[i] > best) {
                        best = logits[i];
                        argmax = i;
                    }
                }
                if (argmax < 0) return { tag: 'keep' };
                return { tag: 'bias', val: [{ token: argmax, bias: 0 }] };
            }
            case 'spin':
                for (;;) {
                    // forever; the daemon's deadline interrupts it
                }
            case 'alloc_mb': {
                const block = new Uint8Array(allocMb * 1048576); // allocMb << 20, without int32 overflow
                block.fill(0xa5);
                kept.push(block);
                return { tag: 'keep' };
            }
            case 'throw':
                throw new Error('js_probe: thrown on purpose');
            case 'err':
                throw errMessage;
            case 'fetch':
                fetch('http://127.0.0.1/');
                return { tag: 'keep' };
            default:
                return { tag: 'keep' };
        }
    },
};
