"""Validates deploy/kubernetes/*.yaml offline, against the real schemas and our invariants.

- Built-in kinds (StatefulSet, Service, ConfigMap, Secret, ...): the Kubernetes JSON
  schemas that the PyPI package kubernetes-validate ships, strict variant (unknown
  fields refused), for Kubernetes K8S_VERSION.
- Custom kinds with a vendored CRD: the openAPIV3Schema of the CRDs in
  deploy/kubernetes/schemas/ (the InferencePool's), with every object closed to unknown
  fields as `kubectl apply` (server-side field validation Strict) does, the metadata
  checked as a Kubernetes ObjectMeta, and the CRD's CEL rules (x-kubernetes-validations)
  that this script implements; any other rule is an error.
- Gateway API kinds (gateway.networking.k8s.io: the HTTPRoute): the compiled validators
  of the npm package @kubernetes-models/gateway-api (GATEWAY_API_MODELS, generated from
  the Gateway API GATEWAY_API_VERSION Go API types that the upstream CRDs are generated
  from), run by tests/node/validate_httproute.mjs under node, which also refuses the
  fields the validator does not know; here, the metadata as a strict ObjectMeta.
- inferd's invariants: the config file the container reads, a listen address on all
  interfaces with the API key from a Secret, the probes' paths, the drain budget
  (terminationGracePeriodSeconds > preStop sleep + server.shutdown_grace_s), one port
  everywhere, the selectors, the HTTPRoute's backendRef, the volumes.

Prints one JSON object on stdout (files, documents, kinds, ...); exits 1 on any error.
`--self-test` instead mutates copies of the manifests (unknown fields, wrong types,
missing required fields, broken invariants) and checks that each mutation is refused
for the expected reason; it exits 1 if one is accepted.

Usage: validate_manifests.py [--self-test] [DIR]   (DIR defaults to deploy/kubernetes)
"""

import argparse
import base64
import copy
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata, resources
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.version import __version__ as KV_VERSION
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"  # the Kubernetes release whose API schemas the manifests must pass
DEFS_ID = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = {"$ref": DEFS_ID + "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
# The Gateway API kinds' validators: the npm package pinned in tests/node/package.json (and
# package-lock.json), installed by scripts/test.sh into target/k8s-node. Its 2.0.0 is
# generated from sigs.k8s.io/gateway-api v1.5.1 (the go.mod of third-party/gateway-api in
# tommy351/kubernetes-models-ts); the package itself records no Gateway API version.
GATEWAY_API_GROUP = "gateway.networking.k8s.io"
GATEWAY_API_MODELS = "@kubernetes-models/gateway-api"
GATEWAY_API_VERSION = "v1.5.1"
NODE_SCRIPT = ROOT / "tests/node/validate_httproute.mjs"
NODE_MODULES = Path(os.environ.get("INFERD_K8S_NODE_MODULES", ROOT / "target/k8s-node/node_modules"))

# The CEL rules of the vendored CRDs, as Python (Kubernetes evaluates them after defaulting).
CEL_RULES = {
    "self.kind != 'Service' || has(self.port)": lambda s: s.get("kind") != "Service"
    or "port" in s,
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))": lambda s: all(
        sum(p2.get("number") == p1.get("number") for p2 in s) == 1 for p1 in s
    ),
}


def k8s_registry():
    """The strict definitions of K8S_VERSION, for the CRDs' metadata."""
    if K8S_VERSION not in kubernetes_validate.utils.all_versions():
        sys.exit(f"kubernetes-validate {KV_VERSION} has no schemas for Kubernetes {K8S_VERSION}")
    path = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict/_definitions.json"
    defs = json.loads(resources.files("kubernetes_validate").joinpath(path).read_text())
    return Registry().with_resource(DEFS_ID, Resource.from_contents(defs))


def closed(node):
    """An OpenAPI v3 structural schema as JSON Schema, objects closed to unknown fields."""
    if isinstance(node, list):
        return [closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: closed(v) for k, v in node.items()}
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def load_crds(schema_dir):
    """(apiVersion, kind) -> (raw openAPIV3Schema, closed JSON schema, source file)."""
    crds = {}
    for f in sorted(schema_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc:
                continue
            if doc.get("kind") != "CustomResourceDefinition":
                sys.exit(f"{f}: not a CustomResourceDefinition")
            spec = doc["spec"]
            entries = [
                (f"{spec['group']}/{v['name']}", spec["names"]["kind"], v["schema"]["openAPIV3Schema"])
                for v in spec["versions"]
                if v.get("served")
            ]
            for api_version, kind, raw in entries:
                schema = closed(raw)
                schema["properties"]["metadata"] = OBJECT_META
                crds[(api_version, kind)] = (raw, schema, f"{schema_dir.name}/{f.name}")
    return crds


def with_defaults(schema, value):
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for k, sub in (schema.get("properties") or {}).items():
        if k not in out and "default" in sub:
            out[k] = sub["default"]
    return out


def cel_errors(schema, value, path):
    errs = []
    for v in schema.get("x-kubernetes-validations", []):
        check = CEL_RULES.get(v["rule"])
        if check is None:
            errs.append(f"{path}: CEL rule not implemented by this validator: {v['rule']}")
        elif not check(with_defaults(schema, value)):
            errs.append(f"{path}: {v['message']} (rule {v['rule']})")
    if isinstance(value, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k in value:
                errs += cel_errors(sub, value[k], f"{path}/{k}".lstrip("/"))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errs += cel_errors(schema["items"], item, f"{path}/{i}")
    return errs


def where(err):
    return "/".join(str(p) for p in err.absolute_path) or "(root)"


def pinned_gateway_api_models():
    deps = json.loads((NODE_SCRIPT.parent / "package.json").read_text())["dependencies"]
    return deps[GATEWAY_API_MODELS]


def is_gateway_api(doc):
    return str(doc.get("apiVersion")).partition("/")[0] == GATEWAY_API_GROUP


GATEWAY_API_ERRORS = {}  # a document's canonical JSON -> its errors (one node run per batch)


def check_gateway_api(docs):
    """Runs tests/node/validate_httproute.mjs once over the documents not checked yet."""
    todo = {json.dumps(d, sort_keys=True): d for d in docs}
    todo = {k: d for k, d in todo.items() if k not in GATEWAY_API_ERRORS}
    if not todo:
        return
    node, pinned = shutil.which("node"), pinned_gateway_api_models()
    setup = f"(scripts/test.sh installs it: npm ci in target/k8s-node from {NODE_SCRIPT.parent.relative_to(ROOT)})"
    if node is None:
        results = [[f"node not found {setup}"]] * len(todo)
    else:
        run = subprocess.run([node, str(NODE_SCRIPT), str(NODE_MODULES)], capture_output=True, text=True,
                             input=json.dumps({"documents": list(todo.values())}))
        out = json.loads(run.stdout) if run.returncode == 0 else {}
        if run.returncode != 0:
            results = [[f"{NODE_SCRIPT.name} failed: {run.stderr.strip()} {setup}"]] * len(todo)
        elif out["version"] != pinned:
            results = [[f"{GATEWAY_API_MODELS} {out['version']} installed, {pinned} pinned {setup}"]] * len(todo)
        else:
            results = out["results"]
    GATEWAY_API_ERRORS.update(zip(todo, results))


def node_version():
    node = shutil.which("node")
    return subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip() if node else None


def schema_errors(doc, crds, registry):
    """Errors of one document against its schema, and the schema's name."""
    if is_gateway_api(doc):
        check_gateway_api([doc])
        errs = [f"[gateway-api] {e}" for e in GATEWAY_API_ERRORS[json.dumps(doc, sort_keys=True)]]
        meta = jsonschema.Draft202012Validator(OBJECT_META, registry=registry)
        errs += [f"[k8s] {'/'.join(['metadata', *map(str, e.absolute_path)])}: {e.message}"
                 for e in meta.iter_errors(doc.get("metadata", {}))]
        return errs, f"{GATEWAY_API_MODELS} {pinned_gateway_api_models()} (Gateway API {GATEWAY_API_VERSION})"
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in crds:
        raw, schema, source = crds[key]
        v = jsonschema.Draft202012Validator(schema, registry=registry)
        errs = [f"[crd] {where(e)}: {e.message}" for e in v.iter_errors(doc)]
        if not errs:
            errs = [f"[cel] {e}" for e in cel_errors(raw, doc, "")]
        return errs, source
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"[k8s] {where(e)}: {e.message}"], "kubernetes"
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"[k8s] {e.message}"], "none"
    return [], f"kubernetes {K8S_VERSION} strict"


def is_usable_api_key(key):
    """inferd's rule for server.api_key (daemon/src/config/server.rs)."""
    return 1 <= len(key) <= 1024 and all(0x21 <= ord(c) <= 0x7E for c in key)


def invariants(docs):
    """The repository's own rules across documents: (names of the checks passed, errors)."""
    passed, errs = [], []

    def check(name, ok, message):
        if ok:
            passed.append(name)
        else:
            errs.append(f"[{name}] {message}")
        return ok

    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    named = lambda kind: {d["metadata"]["name"]: d for d in by_kind.get(kind, [])}  # noqa: E731
    sets = by_kind.get("StatefulSet", [])
    if not check("statefulset", len(sets) == 1, f"expected one StatefulSet, found {len(sets)}"):
        return passed, errs
    sts = sets[0]
    tmpl = sts["spec"]["template"]
    pod, labels = tmpl["spec"], tmpl["metadata"].get("labels", {})
    ctrs = [c for c in pod["containers"] if c["name"] == "inferd"]
    if not check("container", len(ctrs) == 1, "no container named inferd"):
        return passed, errs
    c = ctrs[0]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    env = {e["name"]: e for e in c.get("env", [])}

    # The config file: `serve --config PATH`, PATH a key of a mounted ConfigMap.
    args = c.get("args", [])
    cfg, cfg_path = None, args[args.index("--config") + 1] if "--config" in args else ""
    mount_dir, key = posixpath.split(cfg_path)
    cm_name = volumes.get(mounts.get(mount_dir), {}).get("configMap", {}).get("name")
    text = named("ConfigMap").get(cm_name, {}).get("data", {}).get(key)
    if "serve" in args and text is not None:
        try:
            cfg = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            text = f"not TOML: {e}"
    if not check("config-file", cfg is not None,
                 f"args {args} must be `serve --config PATH` with PATH a key of a mounted ConfigMap ({text})"):
        return passed, errs
    default = tomllib.loads((ROOT / "configs/inferd.toml").read_text())

    def setting(section, name):
        e = env.get(f"INFERD__{section.upper()}__{name.upper()}", {})
        if "value" in e:
            return e["value"]
        return cfg.get(section, {}).get(name, default.get(section, {}).get(name))

    # Listening on all interfaces, with the API key from a Secret (never in the ConfigMap).
    listen = str(setting("server", "listen"))
    host, _, port_text = listen.rpartition(":")
    port = int(port_text) if port_text.isdigit() else -1
    check("listen", host.strip("[]") in ("0.0.0.0", "::"),
          f"server.listen = {listen!r}: the container must listen on 0.0.0.0")
    ref = env.get("INFERD__SERVER__API_KEY", {}).get("valueFrom", {}).get("secretKeyRef", {})
    secret = named("Secret").get(ref.get("name"), {})
    values = dict(secret.get("stringData", {}))
    values.update({k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()})
    check("api-key-from-secret", ref.get("key") in values and "api_key" not in cfg.get("server", {}),
          f"INFERD__SERVER__API_KEY must come from a key of a Secret here (secretKeyRef {ref}), "
          "and the ConfigMap must hold no server.api_key")
    check("example-secret", not any(is_usable_api_key(v) for v in values.values()),
          f"Secret {ref.get('name')} holds a usable API key: commit only a placeholder inferd refuses")

    # Probes: readiness on /ready, liveness on /health, both on the listen port.
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    resolve = lambda p: ports.get(p, -1) if isinstance(p, str) else p  # noqa: E731
    probes = {k: c.get(k, {}).get("httpGet", {}) for k in ("readinessProbe", "livenessProbe")}
    check("probes", probes["readinessProbe"].get("path") == "/ready"
          and probes["livenessProbe"].get("path") == "/health",
          f"readinessProbe must GET /ready and livenessProbe /health (got {probes})")

    # One port: server.listen, containerPort, probes, Service targetPort, InferencePool.
    svc_ports = [resolve(p.get("targetPort", p["port"])) for s in by_kind.get("Service", [])
                 for p in s["spec"].get("ports", [])]
    pool_ports = [p["number"] for ip in by_kind.get("InferencePool", []) for p in ip["spec"]["targetPorts"]]
    seen = [port, ports.get("http", -1), *(resolve(g.get("port")) for g in probes.values()),
            *svc_ports, *pool_ports]
    check("ports", port > 0 and set(seen) == {port} and svc_ports and pool_ports,
          f"server.listen port {port}, containerPort http {ports.get('http')}, probes, Service "
          f"targetPorts {svc_ports} and InferencePool targetPorts {pool_ports} must all be one port")
    # The KV-cache event sockets ([kv_events], defaults from configs/inferd.toml) bind
    # every interface on the containerPorts kv-events and kv-replay ("" = no replay).
    kv = {k: setting("kv_events", k) for k in ("enabled", "endpoint", "replay_endpoint")}
    if kv["enabled"] in (True, "true"):
        want = {"kv-events": kv.get("endpoint", ""), "kv-replay": kv.get("replay_endpoint", "")}
        want = {name: ep for name, ep in want.items() if ep or name == "kv-events"}

        def reachable(name, ep):
            host, _, port = ep.removeprefix("tcp://").rpartition(":")
            return ep.startswith("tcp://") and host in ("*", "0.0.0.0") and port == str(ports.get(name))
        check("kv-events", all(reachable(n, ep) for n, ep in want.items()),
              f"[kv_events] endpoints {want} must bind tcp://*:PORT on the containerPorts {ports}")

    # Drain: the kubelet's SIGKILL comes after preStop + shutdown_grace_s.
    grace = int(setting("server", "shutdown_grace_s"))
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    tgps = pod.get("terminationGracePeriodSeconds")
    explicit = "shutdown_grace_s" in cfg.get("server", {}) or "INFERD__SERVER__SHUTDOWN_GRACE_S" in env
    check("termination-grace", explicit and tgps is not None and tgps > pre_stop + grace,
          f"terminationGracePeriodSeconds ({tgps}) must be set and exceed preStop sleep ({pre_stop}) + "
          f"server.shutdown_grace_s ({grace}, which the ConfigMap or the environment must set)")

    # Selectors: the StatefulSet's, each Service's and each InferencePool's match the pods.
    subset = lambda sel: bool(sel) and all(labels.get(k) == v for k, v in sel.items())  # noqa: E731
    selectors = [sts["spec"]["selector"].get("matchLabels")]
    selectors += [s["spec"].get("selector") for s in by_kind.get("Service", [])]
    selectors += [p["spec"]["selector"].get("matchLabels") for p in by_kind.get("InferencePool", [])]
    check("selectors", all(subset(s) for s in selectors) and sts["spec"].get("serviceName") in named("Service")
          and by_kind.get("InferencePool"),
          f"selectors {selectors} must match the pod labels {labels}; serviceName must name a Service here")

    # The HTTPRoute sends everything to an InferencePool defined here.
    refs = [b for r in by_kind.get("HTTPRoute", []) for rule in r["spec"].get("rules", [])
            for b in rule.get("backendRefs", [])]
    check("httproute-backend", bool(refs) and all(
        b.get("group") == "inference.networking.k8s.io" and b.get("kind") == "InferencePool"
        and b.get("name") in named("InferencePool") for b in refs),
        f"every HTTPRoute backendRef must name an InferencePool here (got {refs})")

    # The model on a mounted volume; the prefix store below (not at) a persistent mount.
    def mount_of(path):
        hits = [m for m in mounts if path.startswith(m.rstrip("/") + "/")]
        return max(hits, key=len) if hits else None

    model, store = str(setting("model", "path")), str(setting("prefix_store", "path"))
    check("volumes", mount_of(model) is not None and mounts.get(mount_of(store)) in claims,
          f"model.path {model} must be on a mounted volume and prefix_store.path {store} "
          f"below a volumeClaimTemplate's mount (mounts {mounts})")
    return passed, errs


def load_docs(manifest_dir):
    files = sorted(manifest_dir.glob("*.yaml"))
    docs = [(f.name, d) for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    return files, docs


def validate_all(docs, crds, registry):
    """All errors of a set of documents, each prefixed with its file, and the report."""
    errors, kinds, sources = [], {}, {}
    check_gateway_api([doc for _, doc in docs if is_gateway_api(doc)])
    for name, doc in docs:
        errs, source = schema_errors(doc, crds, registry)
        kind = str(doc.get("kind"))
        kinds[kind] = kinds.get(kind, 0) + 1
        sources[kind] = source
        errors += [f"{name} ({kind}): {e}" for e in errs]
    passed, inv_errors = [], []
    if not errors:  # cross-document rules assume each document has its schema's shape
        passed, inv_errors = invariants([d for _, d in docs])
    return errors + inv_errors, {"kinds": kinds, "schemas": sources, "invariants": passed}


def at(doc, path):
    """The parent and key of a path: "spec.ports.0.port", or a tuple for keys with dots."""
    *parents, last = path.split(".") if isinstance(path, str) else path
    node = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    return node, (int(last) if isinstance(node, list) else last)


def put(path, value):
    def f(doc):
        node, key = at(doc, path)
        node[key] = value
    return f


def delete(path):
    def f(doc):
        node, key = at(doc, path)
        del node[key]
    return f


def edit_toml(old, new):
    def f(doc):
        text = doc["data"]["inferd.toml"]
        assert old in text, f"{old!r} not in the ConfigMap"
        doc["data"]["inferd.toml"] = text.replace(old, new)
    return f


U = "inferdUnknownField"
C = "spec.template.spec.containers.0."
# (file, label, mutation, text the refusal must contain)
MUTATIONS = [
    ("configmap.yaml", "unknown top-level field", put(U, "x"), U),
    ("configmap.yaml", "data value of wrong type", put(("data", "inferd.toml"), 1), "is not of type"),
    ("configmap.yaml", "config file key missing", delete(("data", "inferd.toml")), "[config-file]"),
    ("configmap.yaml", "loopback listen", edit_toml('"0.0.0.0:8080"', '"127.0.0.1:8080"'), "[listen]"),
    ("configmap.yaml", "other listen port", edit_toml('"0.0.0.0:8080"', '"0.0.0.0:9000"'), "[ports]"),
    ("configmap.yaml", "grace above the budget", edit_toml("shutdown_grace_s = 30", "shutdown_grace_s = 55"),
     "[termination-grace]"),
    ("configmap.yaml", "grace left implicit", edit_toml("shutdown_grace_s = 30", ""), "[termination-grace]"),
    ("configmap.yaml", "prefix store off the volume",
     edit_toml('"/var/lib/inferd/prefix-store"', '"/tmp/prefix-store"'), "[volumes]"),
    ("configmap.yaml", "prefix store at the mount point",
     edit_toml('"/var/lib/inferd/prefix-store"', '"/var/lib/inferd"'), "[volumes]"),
    ("configmap.yaml", "KV events on another port", edit_toml('"tcp://*:5557"', '"tcp://*:6000"'),
     "[kv-events]"),
    ("configmap.yaml", "KV events on loopback", edit_toml('"tcp://*:5557"', '"tcp://127.0.0.1:5557"'),
     "[kv-events]"),
    ("configmap.yaml", "API key in the ConfigMap", edit_toml("[server]", '[server]\napi_key = "k"'),
     "[api-key-from-secret]"),
    ("secret.example.yaml", "unknown top-level field", put(U, "x"), U),
    ("secret.example.yaml", "key of wrong type", put("stringData.api-key", 1), "is not of type"),
    ("secret.example.yaml", "key missing", delete("stringData.api-key"), "[api-key-from-secret]"),
    ("secret.example.yaml", "usable key committed", put("stringData.api-key", "0123456789abcdef"),
     "[example-secret]"),
    ("service.yaml", "unknown spec field", put(f"spec.{U}", "x"), U),
    ("service.yaml", "unknown port field", put(f"spec.ports.0.{U}", "x"), U),
    ("service.yaml", "port of wrong type", put("spec.ports.0.port", "8080"), "is not of type"),
    ("service.yaml", "port missing", delete("spec.ports.0.port"), "is a required property"),
    ("service.yaml", "other targetPort", put("spec.ports.0.targetPort", 9000), "[ports]"),
    ("service.yaml", "selector off the pods", put("spec.selector", {"app": "other"}), "[selectors]"),
    ("statefulset.yaml", "unknown spec field", put(f"spec.{U}", "x"), U),
    ("statefulset.yaml", "unknown probe field", put(C + f"readinessProbe.httpGet.{U}", "x"), U),
    ("statefulset.yaml", "replicas of wrong type", put("spec.replicas", "2"), "is not of type"),
    ("statefulset.yaml", "containerPort of wrong type", put(C + "ports.0.containerPort", "8080"), "is not of type"),
    ("statefulset.yaml", "selector missing", delete("spec.selector"), "is a required property"),
    ("statefulset.yaml", "container name missing", delete(C + "name"), "is a required property"),
    ("statefulset.yaml", "grace period too short", put("spec.template.spec.terminationGracePeriodSeconds", 30),
     "[termination-grace]"),
    ("statefulset.yaml", "readiness on /health", put(C + "readinessProbe.httpGet.path", "/health"), "[probes]"),
    ("statefulset.yaml", "liveness on /ready", put(C + "livenessProbe.httpGet.path", "/ready"), "[probes]"),
    ("statefulset.yaml", "probe on another port", put(C + "livenessProbe.httpGet.port", 9000), "[ports]"),
    ("statefulset.yaml", "other Secret", put(C + "env.1.valueFrom.secretKeyRef.name", "other"),
     "[api-key-from-secret]"),
    ("statefulset.yaml", "other config path", put(C + "args.2", "/etc/other/inferd.toml"), "[config-file]"),
    ("statefulset.yaml", "pod labels off the selectors", put("spec.template.metadata.labels",
                                                             {"app.kubernetes.io/name": "other"}), "[selectors]"),
    ("inferencepool.yaml", "unknown spec field", put(f"spec.{U}", "x"), U),
    ("inferencepool.yaml", "unknown endpointPickerRef field", put(f"spec.endpointPickerRef.{U}", "x"), U),
    ("inferencepool.yaml", "unknown metadata field", put(f"metadata.{U}", "x"), U),
    ("inferencepool.yaml", "port number of wrong type", put("spec.targetPorts.0.number", "8080"), "is not of type"),
    ("inferencepool.yaml", "port number out of range", put("spec.targetPorts.0.number", 70000), "maximum"),
    ("inferencepool.yaml", "failureMode not in the enum", put("spec.endpointPickerRef.failureMode", "Sometimes"),
     "is not one of"),
    ("inferencepool.yaml", "targetPorts missing", delete("spec.targetPorts"), "is a required property"),
    ("inferencepool.yaml", "EPP Service port missing (CEL)", delete("spec.endpointPickerRef.port"),
     "port is required when kind is 'Service'"),
    ("inferencepool.yaml", "duplicate target ports (CEL)", put("spec.targetPorts", [{"number": 8080}] * 2),
     "port number must be unique"),
    ("inferencepool.yaml", "other target port", put("spec.targetPorts.0.number", 8081), "[ports]"),
    ("inferencepool.yaml", "selector off the pods", put(("spec", "selector", "matchLabels", "app.kubernetes.io/name"), "x"),
     "[selectors]"),
    ("httproute.yaml", "unknown top-level field", put(U, "x"), f'[gateway-api] (root): unknown field "{U}"'),
    ("httproute.yaml", "unknown spec field", put(f"spec.{U}", "x"), f'[gateway-api] spec: unknown field "{U}"'),
    ("httproute.yaml", "unknown backendRef field", put(f"spec.rules.0.backendRefs.0.{U}", {"a": 1}),
     f'[gateway-api] spec/rules/0/backendRefs/0: unknown field "{U}"'),
    ("httproute.yaml", "unknown path match field", put(f"spec.rules.0.matches.0.path.{U}", "x"),
     f'[gateway-api] spec/rules/0/matches/0/path: unknown field "{U}"'),
    ("httproute.yaml", "unknown metadata field", put(f"metadata.{U}", "x"), f'[gateway-api] metadata: unknown field "{U}"'),
    ("httproute.yaml", "spec missing", delete("spec"), "[gateway-api] (root): must have required property spec"),
    ("httproute.yaml", "apiVersion not served", put("apiVersion", "gateway.networking.k8s.io/v2"),
     "has no schema IoK8sSigsGatewayApiApisV2HTTPRoute"),
    ("httproute.yaml", "label value of wrong type", put(("metadata", "labels", "app.kubernetes.io/name"), 1),
     "[gateway-api] metadata/labels/app.kubernetes.io~1name: must be string"),
    ("httproute.yaml", "parentRef name missing", delete("spec.parentRefs.0.name"),
     "[gateway-api] spec/parentRefs/0: must have required property name"),
    ("httproute.yaml", "parentRef port out of range", put("spec.parentRefs.0.port", 70000),
     "[gateway-api] spec/parentRefs/0/port: must be <= 65535"),
    ("httproute.yaml", "hostname not a DNS name", put("spec.hostnames", ["Inferd_Host"]),
     "[gateway-api] spec/hostnames/0: must match pattern"),
    ("httproute.yaml", "no rules", put("spec.rules", []), "[gateway-api] spec/rules: must NOT have less than 1 item"),
    ("httproute.yaml", "17 rules", lambda d: d["spec"].update(rules=d["spec"]["rules"] * 17),
     "[gateway-api] spec/rules: must NOT have more than 16 items"),
    ("httproute.yaml", "backendRef name of wrong type", put("spec.rules.0.backendRefs.0.name", 7),
     "[gateway-api] spec/rules/0/backendRefs/0/name: must be string"),
    ("httproute.yaml", "backendRef name missing", delete("spec.rules.0.backendRefs.0.name"),
     "[gateway-api] spec/rules/0/backendRefs/0: must have required property name"),
    ("httproute.yaml", "backendRef name empty", put("spec.rules.0.backendRefs.0.name", ""),
     "[gateway-api] spec/rules/0/backendRefs/0/name: must NOT be shorter than 1 character"),
    ("httproute.yaml", "backendRef name too long", put("spec.rules.0.backendRefs.0.name", "i" * 254),
     "[gateway-api] spec/rules/0/backendRefs/0/name: must NOT be longer than 253 characters"),
    ("httproute.yaml", "backendRef kind not a kind", put("spec.rules.0.backendRefs.0.kind", "Inference Pool"),
     "[gateway-api] spec/rules/0/backendRefs/0/kind: must match pattern"),
    ("httproute.yaml", "backendRef group not a DNS name", put("spec.rules.0.backendRefs.0.group", "Inference_Pools"),
     "[gateway-api] spec/rules/0/backendRefs/0/group: must match pattern"),
    ("httproute.yaml", "backendRef weight negative", put("spec.rules.0.backendRefs.0.weight", -1),
     "[gateway-api] spec/rules/0/backendRefs/0/weight: must be >= 0"),
    ("httproute.yaml", "path type not in the enum", put("spec.rules.0.matches.0.path.type", "Prefix"),
     "[gateway-api] spec/rules/0/matches/0/path/type: must be equal to one of the allowed values"),
    ("httproute.yaml", "method not in the enum", put("spec.rules.0.matches.0.method", "FETCH"),
     "[gateway-api] spec/rules/0/matches/0/method: must be equal to one of the allowed values"),
    ("httproute.yaml", "timeout not a duration", put("spec.rules.0.timeouts.request", "5 minutes"),
     "[gateway-api] spec/rules/0/timeouts/request: must match pattern"),
    ("httproute.yaml", "timeout of wrong type", put("spec.rules.0.timeouts.request", 300),
     "[gateway-api] spec/rules/0/timeouts/request: must be string"),
    ("httproute.yaml", "backendRef to another pool", put("spec.rules.0.backendRefs.0.name", "other"),
     "[httproute-backend]"),
    ("httproute.yaml", "backendRef to a Service", put("spec.rules.0.backendRefs.0.kind", "Service"),
     "[httproute-backend]"),
]


def self_test(docs, crds, registry):
    cases, accepted, runs = [], [], []
    for file, label, mutate, expect in MUTATIONS:
        targets = [i for i, (name, _) in enumerate(docs) if name == file]
        mutated = copy.deepcopy(docs)
        try:
            if len(targets) != 1:
                raise LookupError(f"{file} must hold one document")
            mutate(mutated[targets[0]][1])
        except (LookupError, AssertionError, ValueError, TypeError) as e:
            accepted.append(f"{file}: {label}: mutation target missing ({e})")
            continue
        runs.append((file, label, expect, mutated))
    # One node run for every mutated Gateway API document.
    check_gateway_api([d for *_, mutated in runs for _, d in mutated if is_gateway_api(d)])
    for file, label, expect, mutated in runs:
        errors, _ = validate_all(mutated, crds, registry)
        hit = next((e for e in errors if expect in e), None)
        if hit is None:
            accepted.append(f"{file}: {label}: expected an error with {expect!r}, got {errors}")
        cases.append({"file": file, "mutation": label, "error": hit})
    return {"mutations": len(MUTATIONS), "rejected": len(MUTATIONS) - len(accepted),
            "accepted": accepted, "cases": cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--self-test", action="store_true", help="check that mutated manifests are refused")
    ap.add_argument("dir", nargs="?", default=str(ROOT / "deploy/kubernetes"))
    opts = ap.parse_args()
    manifest_dir = Path(opts.dir)
    registry = k8s_registry()
    crds = load_crds(manifest_dir / "schemas")
    files, docs = load_docs(manifest_dir)
    errors, report = validate_all(docs, crds, registry)
    if opts.self_test:
        out = self_test(docs, crds, registry)
        out["baseline_errors"] = errors
        print(json.dumps(out, indent=1))
        for line in errors + out["accepted"]:
            print(line, file=sys.stderr)
        return 1 if errors or out["accepted"] else 0
    out = {
        "files": len(files),
        "documents": len(docs),
        **report,
        "kubernetes_version": K8S_VERSION,
        "kubernetes_validate": KV_VERSION,
        "jsonschema": metadata.version("jsonschema"),
        "crds": sorted(f"{k} {v} ({src})" for (v, k), (_, _, src) in crds.items()),
        "gateway_api": {"package": f"{GATEWAY_API_MODELS}@{pinned_gateway_api_models()}",
                        "gateway_api_version": GATEWAY_API_VERSION, "node": node_version()},
        "errors": errors,
    }
    print(json.dumps(out, indent=1))
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
