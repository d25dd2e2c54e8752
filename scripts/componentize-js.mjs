// Builds one JavaScript plugin into a WebAssembly component with ComponentizeJS's JS API
// (no jco CLI). Called by scripts/build-plugins-js.sh:
//
//   node scripts/componentize-js.mjs TOOLS_DIR SOURCE.js WIT_DIR WORLD OUT.wasm
//
// TOOLS_DIR holds node_modules with the pinned @bytecodealliance/componentize-js
// (scripts/plugin-tools-js/package.json). The component is written to OUT.wasm.tmp and
// renamed to OUT.wasm, so a failed build never leaves a partial output.
//
// Features: `http` and `fetch-event` are disabled (otherwise the component imports
// wasi:http/*, which the daemon refuses); `stdio`, `random` and `clocks` stay (console,
// Math.random/crypto, Date/performance), served by the daemon's deny-by-default WASI.
//
// Preopens: ComponentizeJS's splicer is itself a component transpiled by jco, running on
// @bytecodealliance/preview2-shim, and reads the WIT directory through that shim's
// wasi:filesystem. preview2-shim 0.25 preopens `/` by default; 0.26 starts with no
// preopens (every path fails with `access`), which is what broke the jco 1.35.0 CLI
// (its own nested shim is 0.26). So, before importing ComponentizeJS, this script
// resolves the shim the splicer will load (from the splicer's own location) and, when it
// has no preopen, gives it `/` (paths passed below are absolute).
import { createRequire } from 'node:module';
import { readFile, writeFile, rename } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const DISABLE = ['http', 'fetch-event'];

const [toolsDir, source, witDir, world, out] = process.argv.slice(2);
if (!out) {
    console.error('usage: componentize-js.mjs TOOLS_DIR SOURCE.js WIT_DIR WORLD OUT.wasm');
    process.exit(2);
}

const pkgDir = join(resolve(toolsDir), 'node_modules', '@bytecodealliance', 'componentize-js');
const pkg = JSON.parse(await readFile(join(pkgDir, 'package.json'), 'utf8'));
const entry = join(pkgDir, typeof pkg.exports === 'string' ? pkg.exports : pkg.exports.import);

const requireFromSplicer = createRequire(join(pkgDir, 'lib', 'spidermonkey-embedding-splicer.js'));
const shimFs = await import(
    pathToFileURL(requireFromSplicer.resolve('@bytecodealliance/preview2-shim/filesystem')).href
);
if (shimFs.preopens.getDirectories().length === 0) {
    if (typeof shimFs._setPreopens !== 'function') {
        throw new Error('preview2-shim has no preopens and no _setPreopens: cannot read the WIT');
    }
    shimFs._setPreopens({ '/': '/' });
}

const { componentize } = await import(pathToFileURL(entry).href);
const { component } = await componentize({
    sourcePath: resolve(source),
    witPath: resolve(witDir),
    worldName: world,
    disableFeatures: DISABLE,
});
await writeFile(`${out}.tmp`, component);
await rename(`${out}.tmp`, out);
