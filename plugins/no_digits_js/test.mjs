// Host test of no_digits_js's logic under plain Node (no component, no daemon):
//   node plugins/no_digits_js/test.mjs
// A module hook maps the `inferd:plugin/host@0.1.1` import of app.js to a stub whose
// vocabulary and special tokens come from globalThis; each case imports a fresh copy of
// app.js (module state = one request).
import { register } from 'node:module';
import assert from 'node:assert/strict';

const stub = `
export const vocabBytes = () => globalThis.__host.vocabBytes();
export const specialTokens = () => globalThis.__host.specialTokens();
export const vocabSize = () => globalThis.__host.vocab.length;
export const tokenBytes = (t) => globalThis.__host.vocab[t];
export const log = () => {};
`;
const hooks = `
export async function resolve(specifier, context, next) {
    if (specifier.startsWith('inferd:plugin/host')) {
        return { url: 'data:text/javascript,' + encodeURIComponent(${JSON.stringify(stub)}), shortCircuit: true };
    }
    return next(specifier, context);
}
`;
register('data:text/javascript,' + encodeURIComponent(hooks));

const enc = new TextEncoder();

/// Vocabulary from strings or byte arrays; `control` lists control token ids.
function setHost(tokens, control) {
    const vocab = tokens.map((t) => (typeof t === 'string' ? enc.encode(t) : Uint8Array.from(t)));
    const offsets = new Uint32Array(vocab.length + 1);
    let n = 0;
    vocab.forEach((t, i) => {
        offsets[i] = n;
        n += t.length;
    });
    offsets[vocab.length] = n;
    const bytes = new Uint8Array(n);
    vocab.forEach((t, i) => bytes.set(t, offsets[i]));
    globalThis.__host = {
        vocab,
        vocabBytes: () => ({ bytes, offsets }),
        specialTokens: () => ({ bos: undefined, eos: control[0], endOfGeneration: control, control }),
    };
}

let fresh = 0;
async function plugin() {
    const url = new URL('./app.js', import.meta.url);
    url.search = `?case=${fresh++}`;
    return (await import(url.href)).contextProcessor;
}

/// Runs the steps of one request: `generated` grows one id at a time; returns the edits.
async function run(config, generated) {
    const p = await plugin();
    p.configure(JSON.stringify(config), 0n);
    const edits = [];
    for (let i = 0; i <= generated.length; i++) {
        const ctx = { sequenceId: 1n, position: 10 + i, promptTokens: 10, generated: Uint32Array.from(generated.slice(0, i)) };
        const edit = p.process(ctx);
        edits.push(edit.tag === 'ban' ? `ban:${Array.from(edit.val).join(',')}` : edit.tag);
    }
    return edits;
}

async function configError(config) {
    const p = await plugin();
    try {
        p.configure(typeof config === 'string' ? config : JSON.stringify(config), 0n);
    } catch (e) {
        assert.equal(typeof e, 'string', 'configure must throw a string (the err variant)');
        return e;
    }
    return null;
}

// 0 <|im_end|> (control)  1 An  2 swer  3 :  4 " 42"  5 7  6 x  7 Ans  8 wer:  9 <|1|> (control)
// 10 a  11 b  12 a1b  13 0xC3 (first byte of é)  14 0xA9 (second byte)  15 é  16 "Answer: 3"
setHost(
    ['<|im_end|>', 'An', 'swer', ':', ' 42', '7', 'x', 'Ans', 'wer:', '<|1|>', 'a', 'b', 'a1b', [0xc3], [0xa9], 'é', 'Answer: 3'],
    [0, 9],
);
const BAN = 'ban:4,5,12,16'; // digit tokens, control <|1|> excluded

let cases = 0;
function check(actual, expected, what) {
    assert.deepEqual(actual, expected, what);
    cases++;
}

// No `after`: banned from the first step on.
check(await run({}, [6, 6]), [BAN, BAN, BAN], 'no after');
// `after` split over three tokens: triggers once the text contains it.
check(await run({ after: 'Answer:' }, [1, 2, 3, 6]), ['keep', 'keep', 'keep', BAN, BAN], 'split over tokens');
// Inside one token, and a token that carries more than `after`.
check(await run({ after: 'Answer:' }, [6, 16, 6]), ['keep', 'keep', BAN, BAN], 'inside one token');
// A control token in the middle adds no bytes: still a match.
check(await run({ after: 'Answer:' }, [7, 0, 8]), ['keep', 'keep', 'keep', BAN], 'control token between');
// ... and a control token's text never matches.
check(await run({ after: '<|im_end|>' }, [0, 6, 0]), ['keep', 'keep', 'keep', 'keep'], 'control text ignored');
// Never triggered: keep throughout.
check(await run({ after: 'Answer:' }, [1, 6, 2, 3]), ['keep', 'keep', 'keep', 'keep', 'keep'], 'broken by x');
// KMP fallback: "aaab" contains "aab" (a naive restart at the mismatch would miss it).
check(await run({ after: 'aab' }, [10, 10, 10, 11]), ['keep', 'keep', 'keep', 'keep', BAN], 'aab in aaab');
check(await run({ after: 'aba' }, [10, 11, 11, 10, 11, 10]), ['keep', 'keep', 'keep', 'keep', 'keep', 'keep', BAN], 'aba');
// Bytes, not characters: é split into two tokens matches "é", either way round.
check(await run({ after: 'é' }, [13, 14]), ['keep', 'keep', BAN], 'é over two byte tokens');
check(await run({ after: 'xé' }, [6, 15]), ['keep', 'keep', BAN], 'é whole');
// Digits before the trigger count as text ("a1b" then "b").
check(await run({ after: '1bb' }, [12, 11]), ['keep', 'keep', BAN], 'digit text');
// Several new tokens in one step (the host may skip none, but the plugin reads them all).
{
    const p = await plugin();
    p.configure('{"after":"Answer:"}', 0n);
    const ctx = (ids) => ({ sequenceId: 1n, position: 0, promptTokens: 0, generated: Uint32Array.from(ids) });
    check(p.process(ctx([])).tag, 'keep', 'batch: start');
    check(p.process(ctx([1, 2, 3])).tag, 'ban', 'batch: three at once');
}
// Out-of-range ids are ignored rather than crashing.
check(await run({ after: 'x' }, [999, 6]), ['keep', 'keep', BAN], 'out of range id');

// Validation.
check(await configError({}), null, '{} accepted');
check(await configError({ after: 'x'.repeat(256) }), null, '256 bytes accepted');
check(await configError({ after: 7 }), 'after: must be a string of 1 to 256 bytes, got 7', 'number');
check(await configError({ after: '' }), 'after: must be a string of 1 to 256 bytes, got "" (0 bytes)', 'empty');
check(
    await configError({ after: 'é'.repeat(129) }),
    `after: must be a string of 1 to 256 bytes, got "${'é'.repeat(63)}… (258 bytes)`,
    'too long in bytes',
);
check(await configError({ after: null }), 'after: must be a string of 1 to 256 bytes, got null', 'null');
check(await configError({ before: 'x' }), 'before: unknown field (known fields: after)', 'unknown');
check(await configError([1]), 'config: must be a JSON object, got [1]', 'array');
check(await configError('nope').then((e) => e.startsWith('config: not valid JSON (')), true, 'bad JSON');

// No digit tokens at all: always keep.
setHost(['a', 'b'], []);
check(await run({}, [0, 1]), ['keep', 'keep', 'keep'], 'nothing to ban');

// In the shape of cargo's summary line, which scripts/test.sh counts.
console.log(`test result: ok. ${cases} passed; 0 failed (no_digits_js under node)`);
