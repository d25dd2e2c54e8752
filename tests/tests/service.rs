//! Running under systemd: the daemon's sd_notify(3) messages arrive, in order, on a
//! datagram socket the test owns (`NOTIFY_SOCKET`), with watchdog pings at half
//! `WATCHDOG_USEC`.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use inferd_e2e::Daemon;

fn index_of(msgs: &[String], needle: &str) -> usize {
    msgs.iter()
        .position(|m| m.contains(needle))
        .unwrap_or_else(|| panic!("no message with {needle:?} in {msgs:#?}"))
}

#[test]
fn notify_socket_gets_status_ready_watchdog_and_stopping_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut daemon = Daemon::start_with_env(&[
        ("NOTIFY_SOCKET", path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "400000"),
    ])
    .expect("daemon");
    let mut msgs: Vec<String> = Vec::new();
    let mut buf = [0u8; 4096];
    let recv = |msgs: &mut Vec<String>, buf: &mut [u8]| {
        let n = sock.recv(buf).expect("a notification");
        msgs.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    };
    // READY, then watchdog pings: 0.2 s apart, so four within ~1 s.
    let t0 = Instant::now();
    while msgs.iter().filter(|m| m.contains("WATCHDOG=1")).count() < 4
        || !msgs.iter().any(|m| m.contains("READY=1"))
    {
        recv(&mut msgs, &mut buf);
    }
    let after_ready = t0.elapsed();
    daemon.signal("TERM").expect("SIGTERM");
    while !msgs.iter().any(|m| m.contains("STOPPING=1")) {
        recv(&mut msgs, &mut buf);
    }
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(30)).expect("exit"),
        Some(0)
    );
    let loading = index_of(&msgs, "STATUS=loading model");
    let store = index_of(&msgs, "STATUS=opening the prefix store");
    let plugins = index_of(&msgs, "STATUS=loading plugins");
    let ready = index_of(&msgs, "READY=1");
    let stopping = index_of(&msgs, "STOPPING=1");
    assert!(
        loading < store && store < plugins && plugins < ready && ready < stopping,
        "{msgs:#?}"
    );
    assert!(
        msgs[ready].contains("STATUS=serving on 127.0.0.1:"),
        "{msgs:#?}"
    );
    assert!(after_ready < Duration::from_secs(120));
}
