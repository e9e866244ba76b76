//! The syncer binary's own `main` (not a copy), built into the e2e package so that its tests can run the
//! syncer as a process of its own: under a memory limit, killed, restarted (`e2e/tests/crash_backoff.rs`).

#[path = "../../../syncer/src/main.rs"]
mod syncer_main;

fn main() -> anyhow::Result<()> {
    syncer_main::main()
}
