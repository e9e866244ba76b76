//! Turns on this machine for the tests of one process: one test per core at a time, and the real nodes'
//! machine-wide lock taken before a core is.
//!
//! Real nodes change the host, so one set runs at a time ([`crate::realnodes`]), and their tests make the
//! suite's longest chain. With libtest's own scheduling (a thread per core, tests in name order), a thread
//! whose test waits for that lock idles a core, and tests of one area sort together: in the e2e suite about
//! a third of a run's core time went that way. So a test takes its turn when it checks its binaries
//! ([`crate::require`]): a core's turn, kept until its thread ends (libtest runs each test on a thread of
//! its own, so that is when the test and its drops are done); and a real-node test
//! ([`crate::realnodes::require`]) first waits for the lock without holding a core's turn, then takes the
//! next free one ahead of other tests. libtest is given more threads than there are cores
//! (`.cargo/config.toml`), so that while one test waits for the lock, others use the cores.
//!
//! A thread keeps at most one turn; asking again is free.

use std::{
    cell::RefCell,
    fs::File,
    sync::{Condvar, Mutex, MutexGuard, OnceLock},
    time::Instant,
};

use crate::{Error, Result};

/// Environment variable: how many tests run at a time (default: the cores).
pub const TURNS_ENV: &str = "E2E_CONCURRENT_TESTS";

#[derive(Default)]
struct Counts {
    /// Threads holding a turn.
    running: usize,
    /// Threads holding the real-node lock and waiting for a turn: they go first.
    real_waiting: usize,
}

struct Turns {
    counts: Mutex<Counts>,
    freed: Condvar,
    limit: usize,
}

fn turns() -> &'static Turns {
    static TURNS: OnceLock<Turns> = OnceLock::new();
    TURNS.get_or_init(|| Turns {
        counts: Mutex::new(Counts::default()),
        freed: Condvar::new(),
        limit: limit_from(std::env::var(TURNS_ENV).ok().as_deref()),
    })
}

/// The number of tests at a time: `E2E_CONCURRENT_TESTS` when it is a positive number, else the cores.
fn limit_from(setting: Option<&str>) -> usize {
    setting
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

impl Turns {
    fn counts(&self) -> MutexGuard<'_, Counts> {
        // A panicking test cannot leave the counts half-updated: every change is one statement.
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn take(&self, ahead: bool) {
        let mut counts = self.counts();
        if ahead {
            counts.real_waiting += 1;
        }
        while counts.running >= self.limit || (!ahead && counts.real_waiting > 0) {
            counts = self
                .freed
                .wait(counts)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if ahead {
            counts.real_waiting -= 1;
        }
        counts.running += 1;
    }

    fn give_back(&self) {
        let mut counts = self.counts();
        counts.running = counts.running.saturating_sub(1);
        drop(counts);
        self.freed.notify_all();
    }
}

/// What this thread holds: a turn, and the real-node lock until real nodes take it over.
#[derive(Default)]
struct Held {
    turn: bool,
    real_node_lock: Option<File>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.turn {
            turns().give_back();
        }
    }
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
}

/// Takes this thread's turn, waiting while as many tests run as there are turns. Kept until the thread ends.
pub fn take_turn() {
    HELD.with_borrow_mut(|held| {
        if !held.turn {
            turns().take(false);
            held.turn = true;
        }
    });
}

/// Takes the machine-wide real-node lock for this thread, then a turn ahead of tests without real nodes. A
/// turn the thread held already is given back while it waits for the lock, so that others use the core.
pub fn take_real_node_turn() -> Result<()> {
    if HELD.with_borrow(|held| held.real_node_lock.is_some()) {
        return Ok(());
    }
    HELD.with_borrow_mut(|held| {
        if std::mem::take(&mut held.turn) {
            turns().give_back();
        }
    });
    let lock = lock_machine()?;
    turns().take(true);
    HELD.with_borrow_mut(|held| {
        held.turn = true;
        held.real_node_lock = Some(lock);
    });
    Ok(())
}

/// The real-node lock this thread took with [`take_real_node_turn`], for real nodes to hold from now on.
pub(crate) fn real_node_lock() -> Option<File> {
    HELD.with_borrow_mut(|held| held.real_node_lock.take())
}

/// Takes the machine-wide lock on real nodes, waiting for the set another process or test has, and logs
/// how long that took.
pub(crate) fn lock_machine() -> Result<File> {
    let asked = Instant::now();
    let path = std::env::temp_dir().join("vc-e2e-realnodes.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(Error::io(format!("opening {}", path.display())))?;
    file.lock()
        .map_err(Error::io(format!("locking {}", path.display())))?;
    log_lock(&format!(
        "waited {:.1} s for the machine-wide lock",
        asked.elapsed().as_secs_f64()
    ));
    Ok(file)
}

/// One line on the process's stderr, past the test harness's capture: how long each test waited for the
/// real-node lock and held it is what a suite's run time is made of. libtest names a test's thread after
/// the test, which says whose line it is.
pub(crate) fn log_lock(what: &str) {
    use std::io::Write;
    let holder = std::thread::current().name().unwrap_or("unnamed").to_owned();
    let _ = writeln!(std::io::stderr(), "real nodes: {holder} {what}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        time::Duration,
    };

    #[test]
    fn the_limit_is_the_setting_when_it_is_a_positive_number_else_the_cores() {
        assert_eq!(limit_from(Some("3")), 3);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        for setting in [None, Some("0"), Some("many"), Some("")] {
            assert_eq!(limit_from(setting), cores, "{setting:?}");
        }
    }

    #[test]
    fn no_more_than_the_limit_run_and_a_real_node_test_goes_first() {
        let turns = Arc::new(Turns {
            counts: Mutex::new(Counts::default()),
            freed: Condvar::new(),
            limit: 2,
        });
        // This thread holds both turns (counted in `running`); three wait, two plain, then one ahead.
        turns.take(false);
        turns.take(false);
        let (running, most) = (Arc::new(AtomicUsize::new(2)), Arc::new(AtomicUsize::new(2)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiter = |name: &'static str, ahead: bool| {
            let (turns, running, most, order) = (turns.clone(), running.clone(), most.clone(), order.clone());
            std::thread::spawn(move || {
                turns.take(ahead);
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                order.lock().expect("order").push(name);
                std::thread::sleep(Duration::from_millis(20));
                running.fetch_sub(1, Ordering::SeqCst);
                turns.give_back();
            })
        };
        let plain = [waiter("plain-1", false), waiter("plain-2", false)];
        std::thread::sleep(Duration::from_millis(50));
        let real = waiter("real", true);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            order.lock().expect("order").is_empty(),
            "nobody runs while both turns are held"
        );
        // A turn comes free: the real-node test takes it, though the plain ones asked first.
        running.fetch_sub(1, Ordering::SeqCst);
        turns.give_back();
        std::thread::sleep(Duration::from_millis(50));
        running.fetch_sub(1, Ordering::SeqCst);
        turns.give_back();
        for thread in plain.into_iter().chain([real]) {
            thread.join().expect("waiter");
        }
        assert_eq!(order.lock().expect("order")[0], "real");
        assert_eq!(order.lock().expect("order").len(), 3);
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "never more than the limit at once"
        );
        assert_eq!(turns.counts().running, 0);
    }
}
