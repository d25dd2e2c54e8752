// Validates Gateway API documents (gateway.networking.k8s.io, e.g. the HTTPRoute of
// deploy/kubernetes/) with the compiled JSON-schema validators of the npm package
// @kubernetes-models/gateway-api (pinned in package.json and package-lock.json here),
// which its authors generate from the Gateway API's Go API types, the same types and
// kubebuilder markers the upstream CRDs are generated from. Called by
// tests/python/validate_manifests.py.
//
// Those validators check types, enums, required fields, patterns, lengths and ranges, but
// let unknown fields through (no additionalProperties). So each document is handed to
// the validator behind Proxies that record which fields it reads: the compiled code reads
// every field its schema defines (and every key of a map), so a field it never read is
// unknown to the schema, and is reported, as `kubectl apply` (field validation Strict)
// refuses it.
//
// Usage: node validate_httproute.mjs NODE_MODULES_DIR < {"documents": [...]}
// Prints {"package", "version", "results": [[error, ...] per document]} (a document whose
// schema the package lacks gets an error); exits 2 when the package is not installed.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const PACKAGE = "@kubernetes-models/gateway-api";
const GROUP = "gateway.networking.k8s.io";
const modules = process.argv[2];
const fail = (msg) => {
  process.stderr.write(`validate_httproute.mjs: ${msg}\n`);
  process.exit(2);
};
if (!modules) fail("usage: node validate_httproute.mjs NODE_MODULES_DIR < documents.json");
const load = (path) => import(pathToFileURL(join(modules, path)).href);

let version;
try {
  version = JSON.parse(readFileSync(join(modules, PACKAGE, "package.json"), "utf8")).version;
} catch (e) {
  fail(`${PACKAGE} is not installed under ${modules} (${e.message})`);
}
const localize = (await load("ajv-i18n/localize/en/index.js")).default;

// A copy of `value` whose objects record the keys read from them in `seen`.
function tracked(value, path, seen) {
  if (Array.isArray(value)) return value.map((v, i) => tracked(v, `${path}/${i}`, seen));
  if (value === null || typeof value !== "object") return value;
  const read = new Set();
  seen.push({ path, keys: Object.keys(value), read });
  const copy = {};
  for (const [k, v] of Object.entries(value)) copy[k] = tracked(v, `${path}/${pointer(k)}`, seen);
  const note = (k) => typeof k === "string" && read.add(k);
  return new Proxy(copy, {
    get: (t, k, r) => (note(k), Reflect.get(t, k, r)),
    has: (t, k) => (note(k), Reflect.has(t, k)),
  });
}

const pointer = (k) => k.replace(/~/g, "~0").replace(/\//g, "~1");
const where = (path) => path.replace(/^\//, "") || "(root)";

async function check(doc) {
  const [group, ver] = String(doc?.apiVersion).split("/");
  if (group !== GROUP || !ver) return [`(root): not a ${GROUP} document`];
  const schema = `IoK8sSigsGatewayApiApis${ver[0].toUpperCase()}${ver.slice(1)}${doc.kind}`;
  let validate;
  try {
    ({ validate } = await load(`${PACKAGE}/_schemas/${schema}.js`));
  } catch {
    return [`(root): ${PACKAGE} ${version} has no schema ${schema} for ${doc.apiVersion} ${doc.kind}`];
  }
  const seen = [];
  const errors = [];
  if (!validate(tracked(doc, "", seen))) {
    localize(validate.errors);
    for (const e of validate.errors) {
      const allowed = e.keyword === "enum" ? ` ${JSON.stringify(e.params.allowedValues)}` : "";
      errors.push(`${where(e.instancePath)}: ${e.message}${allowed} (${e.keyword})`);
    }
  }
  // Unknown fields: the outermost ones only (the validator never enters them).
  const unknown = [];
  for (const { path, keys, read } of seen) {
    if (unknown.some((u) => path === u || path.startsWith(`${u}/`))) continue;
    for (const k of keys.filter((k) => !read.has(k))) {
      unknown.push(`${path}/${pointer(k)}`);
      errors.push(`${where(path)}: unknown field "${k}" (not in the ${schema} schema)`);
    }
  }
  return [...new Set(errors)];
}

let input;
try {
  input = JSON.parse(readFileSync(0, "utf8"));
} catch (e) {
  fail(`stdin is not JSON: ${e.message}`);
}
const results = [];
for (const doc of input.documents) results.push(await check(doc));
process.stdout.write(JSON.stringify({ package: PACKAGE, version, results }) + "\n");
