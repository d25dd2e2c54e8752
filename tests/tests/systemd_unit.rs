//! `configs/inferd.service` passes `systemd-analyze verify` (with `ExecStart` pointing at
//! the built binary; scripts/test.sh installs systemd when the command is missing).

use inferd_e2e::{inferd_binary, systemd_analyze_verify, workspace_root};

#[test]
fn the_unit_file_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(workspace_root().join("configs/inferd.service"))
        .expect("configs/inferd.service");
    for key in [
        "Type=notify",
        "WatchdogSec=",
        "ExecReload=",
        "StateDirectory=inferd",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
    ] {
        assert!(unit.contains(key), "the unit lacks {key}");
    }
    let unit = unit.replace(
        "/usr/local/bin/inferd",
        inferd_binary().to_str().expect("utf-8 path"),
    );
    systemd_analyze_verify(&unit);
}
