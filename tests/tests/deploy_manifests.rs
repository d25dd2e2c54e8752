//! `deploy/kubernetes/` passes the real schemas offline (no cluster): the built-in kinds
//! the Kubernetes JSON schemas of the `kubernetes-validate` package (strict), the
//! InferencePool the CRD vendored from the Gateway API Inference Extension, the HTTPRoute
//! the validators of the npm package `@kubernetes-models/gateway-api` (generated from the
//! Gateway API v1.5.1 types; run under node from `target/k8s-node`, unknown fields
//! refused), plus the repository's invariants (probes, drain budget, port, selectors,
//! Secret, backendRef); and the validator refuses every mutation of its self-test
//! (`tests/python/validate_manifests.py`, run with `target/pyenv`).

use serde_json::Value;

use inferd_e2e::run_python;

fn count(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count: {v}"))
}

#[test]
fn manifests_pass_the_kubernetes_and_crd_schemas_and_our_invariants() {
    let out = run_python("validate_manifests.py", &[], None).expect("validate_manifests.py");
    assert_eq!(count(&out, "files"), 6, "{out}");
    assert_eq!(count(&out, "documents"), 6, "{out}");
    for kind in [
        "StatefulSet",
        "Service",
        "ConfigMap",
        "Secret",
        "InferencePool",
        "HTTPRoute",
    ] {
        assert_eq!(out["kinds"][kind].as_u64(), Some(1), "{kind}: {out}");
    }
    assert_eq!(
        out["schemas"]["InferencePool"], "schemas/inference.networking.k8s.io_inferencepools.yaml",
        "{out}"
    );
    assert_eq!(
        out["schemas"]["HTTPRoute"], "@kubernetes-models/gateway-api 2.0.0 (Gateway API v1.5.1)",
        "{out}"
    );
    for kind in ["StatefulSet", "Service", "ConfigMap", "Secret"] {
        assert_eq!(
            out["schemas"][kind], "kubernetes 1.33.0 strict",
            "{kind}: {out}"
        );
    }
    let passed: Vec<&str> = out["invariants"]
        .as_array()
        .expect("invariants")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in [
        "config-file",
        "listen",
        "api-key-from-secret",
        "example-secret",
        "probes",
        "ports",
        "kv-events",
        "termination-grace",
        "selectors",
        "httproute-backend",
        "volumes",
    ] {
        assert!(
            passed.contains(&name),
            "invariant {name} not checked: {out}"
        );
    }
    assert_eq!(out["errors"].as_array().map(Vec::len), Some(0), "{out}");
}

#[test]
fn the_validator_refuses_unknown_fields_wrong_types_missing_fields_and_broken_invariants() {
    let out = run_python("validate_manifests.py", &["--self-test"], None)
        .expect("validate_manifests.py --self-test");
    let total = count(&out, "mutations");
    assert!(total >= 72, "{out}");
    assert_eq!(count(&out, "rejected"), total, "{out}");
    assert_eq!(out["accepted"].as_array().map(Vec::len), Some(0), "{out}");
    assert_eq!(
        out["baseline_errors"].as_array().map(Vec::len),
        Some(0),
        "{out}"
    );
    let errors: Vec<&str> = out["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter_map(|c| c["error"].as_str())
        .collect();
    assert_eq!(errors.len() as u64, total, "{out}");
    // Each kind of refusal, from each kind of schema.
    for needle in [
        "[k8s] (root): Additional properties are not allowed",
        "[k8s] spec/replicas: '2' is not of type",
        "[k8s] spec: 'selector' is a required property",
        "[crd] spec/endpointPickerRef: Additional properties are not allowed",
        "[crd] spec/targetPorts/0/number: '8080' is not of type 'integer'",
        "[crd] spec: 'targetPorts' is a required property",
        "[cel] spec/endpointPickerRef: port is required when kind is 'Service'",
        "[gateway-api] spec: unknown field \"inferdUnknownField\"",
        "[gateway-api] spec/rules/0/backendRefs/0/name: must be string",
        "[gateway-api] spec/rules/0/backendRefs/0: must have required property name",
        "[gateway-api] spec/rules/0/matches/0/path/type: must be equal to one of the allowed values",
        "[termination-grace]",
        "[kv-events]",
        "[probes]",
        "[selectors]",
        "[httproute-backend]",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "no refusal with {needle:?}: {out}"
        );
    }
}
