//! CPU placement of the harness's processes and threads, for benchmarks whose topology matters (the super
//! cluster on some cores, the tenants and the syncer on others).
//!
//! Pinning goes through `taskset` (util-linux), since the workspace forbids `unsafe` and so
//! `sched_setaffinity` itself: a whole process (every thread it has; threads it starts later inherit the
//! mask of the thread that starts them) or one thread of this process. What took is read back from
//! `/proc/<pid>/task/<tid>/status` (`Cpus_allowed_list`).

use std::{
    collections::BTreeSet,
    path::Path,
    process::Command,
    sync::{Arc, Mutex},
};

use crate::{Error, Result};

fn taskset(args: &[&str], context: &str) -> Result<()> {
    let output = Command::new("taskset")
        .args(args)
        .output()
        .map_err(Error::io(format!("{context}: running taskset")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Command {
        context: context.to_owned(),
        command: format!("taskset {}", args.join(" ")),
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// Pins every thread of process `pid` to `cpus` (a `taskset -c` list such as `0` or `1-3`).
pub fn pin_process(pid: u32, cpus: &str) -> Result<()> {
    let pid = pid.to_string();
    taskset(
        &["-a", "-p", "-c", cpus, &pid],
        &format!("pinning process {pid} to CPUs {cpus}"),
    )
}

/// Lowers the scheduling priority of every thread of process `pid` to `niceness` (threads it starts later
/// inherit it from the thread that starts them), through `renice`, which sets one thread per id.
///
/// For benchmarks that keep a core saturated: the kernel's per-CPU work items run at nice 0 and wait behind
/// whatever holds the core. When a long one (conntrack's `gc_worker`) got too little of a saturated core,
/// everything queued behind it on that core waited with it, tasks that needed it (`lru_add_drain_all`)
/// blocked, and a benchmark hung (`BUG: workqueue lockup ... stuck for 127s`). Niced workload threads
/// leave the kernel's workers their share without changing how the workload shares the core among itself.
pub fn lower_priority(pid: u32, niceness: i32) -> Result<()> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(Error::io(format!("listing the threads of process {pid}")))?;
    let tids: Vec<String> = tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str().map(str::to_owned))
        .collect();
    for chunk in tids.chunks(256) {
        let niceness = niceness.to_string();
        let mut args = vec!["-n", niceness.as_str(), "-p"];
        args.extend(chunk.iter().map(String::as_str));
        let output = Command::new("renice")
            .args(&args)
            .output()
            .map_err(Error::io(format!(
                "lowering the priority of process {pid}: running renice"
            )))?;
        // A thread that ended meanwhile is no failure; renice reports the others it set.
        if !output.status.success() && !String::from_utf8_lossy(&output.stderr).contains("No such process") {
            return Err(Error::Command {
                context: format!("lowering the priority of process {pid}"),
                command: format!("renice {}", args.join(" ")),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
    }
    Ok(())
}

/// Pins one thread (by its kernel thread id) to `cpus`.
pub fn pin_thread(tid: u32, cpus: &str) -> Result<()> {
    let tid = tid.to_string();
    taskset(
        &["-p", "-c", cpus, &tid],
        &format!("pinning thread {tid} to CPUs {cpus}"),
    )
}

/// The kernel thread id of the calling thread.
pub fn current_thread_id() -> Option<u32> {
    // `/proc/thread-self` links to `<pid>/task/<tid>`.
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

fn allowed_list(status: &Path) -> Option<String> {
    std::fs::read_to_string(status)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_owned())
}

/// The distinct `Cpus_allowed_list`s of the threads of `pid` (one entry when every thread agrees).
pub fn process_affinity(pid: u32) -> BTreeSet<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return BTreeSet::new();
    };
    tasks
        .flatten()
        .filter_map(|task| allowed_list(&task.path().join("status")))
        .collect()
}

/// The distinct `Cpus_allowed_list`s of some threads of this process.
pub fn threads_affinity(tids: &[u32]) -> BTreeSet<String> {
    tids.iter()
        .filter_map(|tid| allowed_list(Path::new(&format!("/proc/self/task/{tid}/status"))))
        .collect()
}

/// The CPUs this process may use when it starts (`Cpus_allowed_list` of `/proc/self/status`), to return
/// to after pinning.
pub fn own_affinity() -> Option<String> {
    allowed_list(Path::new("/proc/self/status"))
}

/// CPU seconds (user + system) that a process, or one thread (`/proc/<pid>/task/<tid>/stat`), has used.
pub fn cpu_seconds(stat_path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(stat_path) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime, in clock ticks of 1/100 s (USER_HZ on Linux).
    (ticks(11) + ticks(12)) / 100.0
}

/// A tokio runtime whose threads (workers and blocking threads) are pinned to `cpus` as they start (not at
/// all when `cpus` is `None`), and the thread ids it started, for accounting.
pub struct PinnedRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    threads: Arc<Mutex<Vec<u32>>>,
}

impl PinnedRuntime {
    /// Starts `workers` worker threads named `name`.
    pub fn new(name: &str, workers: usize, cpus: Option<String>) -> Result<Self> {
        let threads = Arc::new(Mutex::new(Vec::new()));
        let recorded = threads.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name(name)
            .enable_all()
            .on_thread_start(move || {
                let Some(tid) = current_thread_id() else {
                    return;
                };
                if let Some(cpus) = &cpus
                    && let Err(error) = pin_thread(tid, cpus)
                {
                    // Read back and printed by the benchmark; a thread left unpinned shows there.
                    tracing::warn!(%error, tid, "could not pin a runtime thread");
                }
                recorded.lock().unwrap_or_else(|e| e.into_inner()).push(tid);
            })
            .build()
            .map_err(Error::io(format!("starting the {name} runtime")))?;
        Ok(Self {
            runtime: Some(runtime),
            threads,
        })
    }

    /// A handle to spawn on it.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the runtime lives until dropped")
            .handle()
            .clone()
    }

    /// Ids of the threads it started that still run.
    pub fn thread_ids(&self) -> Vec<u32> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.retain(|tid| Path::new(&format!("/proc/self/task/{tid}")).exists());
        threads.clone()
    }

    /// CPU seconds its threads have used (of those still running).
    pub fn cpu_seconds(&self) -> f64 {
        self.thread_ids()
            .iter()
            .map(|tid| cpu_seconds(&format!("/proc/self/task/{tid}/stat")))
            .sum()
    }
}

impl Drop for PinnedRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside another runtime; its tasks are aborted anyway.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_affinity_and_thread_id() {
        let tid = current_thread_id().expect("a thread id");
        assert!(tid > 0);
        let own = own_affinity().expect("Cpus_allowed_list");
        assert!(!own.is_empty());
        let threads = threads_affinity(&[tid]);
        assert_eq!(threads.len(), 1, "{threads:?}");
        assert!(process_affinity(std::process::id()).contains(threads.iter().next().expect("one")));
    }

    #[test]
    fn cpu_seconds_parses_proc_stat() {
        let busy = std::time::Instant::now();
        let mut x = 0u64;
        while busy.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(cpu_seconds(&format!("/proc/{}/stat", std::process::id())) >= 0.0);
        assert_eq!(cpu_seconds("/proc/no-such-process/stat"), 0.0);
    }

    #[test]
    fn a_pinned_runtime_pins_its_threads() {
        let own = own_affinity().expect("Cpus_allowed_list");
        // The first CPU this process may use: pinning to it always succeeds.
        let first = own.split([',', '-']).next().expect("a CPU").to_owned();
        let runtime = PinnedRuntime::new("pinned-test", 1, Some(first.clone())).expect("runtime");
        // Worker threads record themselves (after pinning) once they run.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while runtime.thread_ids().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let threads = runtime.thread_ids();
        assert!(!threads.is_empty(), "no worker thread started");
        assert_eq!(threads_affinity(&threads), BTreeSet::from([first]));
    }
}
