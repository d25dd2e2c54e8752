//! The registry on the tiny llama and its PEFT fixture adapters.

use std::collections::HashSet;
use std::sync::Arc;

use super::{AdapterRegistry, Residency, UnloadError};
use crate::model::lora::tests::peft_dir;
use crate::model::lora::LoraBase;
use crate::model::reference_tests::{load_model, tiny_dir};

fn registry(max_loras: usize) -> Arc<AdapterRegistry> {
    let model = load_model(&tiny_dir("llama"));
    Arc::new(AdapterRegistry::new(LoraBase::of(&model), max_loras, 64))
}

fn ready(r: Residency) -> bool {
    matches!(r, Residency::Ready(_))
}

#[test]
fn adapters_beyond_max_loras_load_on_demand_evicting_idle_ones() {
    let reg = registry(1);
    let a = reg.register("a", &peft_dir("llama")).expect("a");
    assert!(a.resident);
    assert_eq!(a.rank, 8);
    let b = reg.register("b", &peft_dir("llama-rslora")).expect("b");
    assert!(!b.resident, "one slot, taken by a");
    let none = HashSet::new();
    assert!(ready(reg.residency("a", &none)));
    // b waits while a runs: a is in use, so it is not evicted.
    let running: HashSet<String> = ["a".to_string()].into();
    assert!(matches!(reg.residency("b", &running), Residency::Pending));
    assert!(reg.take_loads().is_empty());
    // Once a is idle, b's request evicts it and queues b's load.
    assert!(matches!(reg.residency("b", &none), Residency::Pending));
    let loads = reg.take_loads();
    assert_eq!(loads.len(), 1);
    assert_eq!(reg.resident_names(), Vec::<String>::new());
    assert!(
        matches!(reg.residency("b", &none), Residency::Pending),
        "loading"
    );
    reg.load_resident(&loads[0].0, &loads[0].1).expect("load");
    assert!(ready(reg.residency("b", &none)));
    assert_eq!(reg.resident_names(), vec!["b".to_string()]);
}

#[test]
fn leases_keep_an_adapter_from_unloading_and_names_are_checked() {
    let reg = registry(4);
    reg.register("a", &peft_dir("llama")).expect("a");
    let e = reg.register("a", &peft_dir("llama")).expect_err("twice");
    assert!(e.to_string().contains("already loaded"), "{e}");
    let e = reg
        .register("bad name", &peft_dir("llama"))
        .expect_err("name");
    assert!(e.to_string().contains("lora_name must be"), "{e}");
    let lease = reg.lease("a", 1.0).expect("lease");
    let twin = lease.clone();
    assert_eq!(reg.info("a").expect("a").active, 2);
    assert_eq!(
        reg.unregister("a"),
        Err(UnloadError::InUse {
            name: "a".into(),
            active: 2
        })
    );
    drop(lease);
    drop(twin);
    assert_eq!(reg.info("a").expect("a").requests_total, 1);
    reg.unregister("a").expect("idle");
    assert_eq!(reg.unregister("a"), Err(UnloadError::NotFound("a".into())));
    assert!(reg.lease("a", 1.0).is_none());
    // A name's request count outlives its unload (the metrics' counter never goes back).
    reg.register("a", &peft_dir("llama")).expect("a again");
    drop(reg.lease("a", 1.0));
    assert_eq!(reg.info("a").expect("a").requests_total, 2);
    assert_eq!(reg.requests_by_name(), [("a".to_string(), 2)]);
}

/// The base model's name is no adapter's; the name checks lead with `lora_name`.
#[test]
fn the_base_models_name_is_refused() {
    let reg = registry(4);
    let reg = std::sync::Arc::new(
        std::sync::Arc::try_unwrap(reg)
            .expect("sole owner")
            .with_base_name("base-model"),
    );
    let e = reg
        .register("base-model", &peft_dir("llama"))
        .expect_err("base name");
    assert_eq!(
        e.message,
        "lora_name \"base-model\" is the base model's name (requests naming it get no adapter)"
    );
    reg.register("a", &peft_dir("llama")).expect("a");
    assert_eq!(
        reg.check_new_name("a"),
        Err("lora_name \"a\": an adapter of this name is already loaded (unload it first)".into())
    );
    assert!(reg
        .check_new_name("")
        .is_err_and(|m| m.starts_with("lora_name must be")));
}

#[test]
fn a_file_that_changed_since_registration_fails_its_requests() {
    let reg = registry(1);
    let dir = tempfile::tempdir().expect("tmp");
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(peft_dir("llama").join(f), dir.path().join(f)).expect("copy");
    }
    reg.register("a", &peft_dir("llama-rslora")).expect("a");
    reg.register("b", dir.path()).expect("b");
    let none = HashSet::new();
    assert!(matches!(reg.residency("b", &none), Residency::Pending));
    let loads = reg.take_loads();
    // Another adapter's weights under b's path.
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(peft_dir("llama-layers").join(f), dir.path().join(f)).expect("copy");
    }
    let e = reg
        .load_resident(&loads[0].0, &loads[0].1)
        .expect_err("changed");
    assert!(e.to_string().contains("changed since it was loaded"), "{e}");
    match reg.residency("b", &none) {
        Residency::Gone(m) => assert!(m.contains("changed since it was loaded"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A load reaches every engine's registry or none; an unload waits for every engine's
/// requests.
#[test]
fn several_registries_load_and_unload_together() {
    use super::several::{register_all, unregister_all};
    let regs = [registry(2), registry(2)];
    let info = register_all(&regs, "a", &peft_dir("llama")).expect("a");
    assert_eq!(info.rank, 8);
    assert!(regs.iter().all(|r| r.contains("a")));
    // The second refuses (the name is taken there only): the first drops it again.
    regs[1]
        .register("b", &peft_dir("llama-rslora"))
        .expect("b on one");
    let e = register_all(&regs, "b", &peft_dir("llama")).expect_err("taken");
    assert!(e.to_string().contains("already loaded"), "{e}");
    assert!(!regs[0].contains("b") && regs[1].contains("b"));
    // A request on the second engine holds it: refused, naming its requests.
    let lease = regs[1].lease("a", 1.0).expect("lease");
    assert_eq!(
        unregister_all(&regs, "a"),
        Err(UnloadError::InUse {
            name: "a".into(),
            active: 1
        })
    );
    assert!(regs.iter().all(|r| r.contains("a")), "nothing unloaded");
    drop(lease);
    unregister_all(&regs, "a").expect("unload");
    assert!(regs.iter().all(|r| !r.contains("a")));
    assert_eq!(
        unregister_all(&regs, "a"),
        Err(UnloadError::NotFound("a".into()))
    );
}
