//! Group commit: one write at a time, and what arrives while one is in flight goes in the next, together.
//! At low load an item is written at once; in a burst many share a write. Used by the token shards'
//! writes ([`crate::tokens::records::Shard`]).

use std::{collections::HashMap, future::Future, sync::Mutex};

/// Group commit: callers [`GroupCommit::submit`] items; one write runs at a time, and the items that
/// arrived while it ran are written together by the next. Each caller gets the result of the write that
/// carried its item.
pub struct GroupCommit<T, R> {
    queue: Mutex<Batches<T, R>>,
    writer: tokio::sync::Mutex<()>,
}

struct Batches<T, R> {
    next: u64,
    waiting: Vec<(u64, T)>,
    results: HashMap<u64, R>,
}

impl<T, R> Default for GroupCommit<T, R> {
    fn default() -> Self {
        Self {
            queue: Mutex::new(Batches {
                next: 0,
                waiting: Vec::new(),
                results: HashMap::new(),
            }),
            writer: tokio::sync::Mutex::new(()),
        }
    }
}

impl<T, R: Clone> GroupCommit<T, R> {
    fn batches(&self) -> std::sync::MutexGuard<'_, Batches<T, R>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes `item` with whatever else is waiting, unless a write already carried it. `abandoned` is the
    /// result when the write that took the item never finished (its caller was cancelled).
    pub async fn submit<F, Fut>(&self, item: T, write: F, abandoned: impl FnOnce() -> R) -> R
    where
        F: FnOnce(Vec<T>) -> Fut,
        Fut: Future<Output = R>,
    {
        let id = {
            let mut batches = self.batches();
            let id = batches.next;
            batches.next += 1;
            batches.waiting.push((id, item));
            id
        };
        let _writing = self.writer.lock().await;
        let batch = {
            let mut batches = self.batches();
            if let Some(result) = batches.results.remove(&id) {
                return result;
            }
            if !batches.waiting.iter().any(|(waiting, _)| *waiting == id) {
                return abandoned();
            }
            std::mem::take(&mut batches.waiting)
        };
        let (ids, items): (Vec<u64>, Vec<T>) = batch.into_iter().unzip();
        let result = write(items).await;
        let mut batches = self.batches();
        for other in ids.into_iter().filter(|other| *other != id) {
            batches.results.insert(other, result.clone());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        time::Duration,
    };

    use super::GroupCommit;

    #[tokio::test]
    async fn group_commit_writes_at_once_and_batches_what_arrives_meanwhile() {
        let commit: Arc<GroupCommit<u32, Vec<u32>>> = Arc::default();
        let writes = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::watch::channel(false);
        let write = |writes: Arc<AtomicUsize>, mut gate: tokio::sync::watch::Receiver<bool>| {
            move |batch: Vec<u32>| async move {
                writes.fetch_add(1, Ordering::SeqCst);
                let _ = gate.wait_for(|open| *open).await;
                batch
            }
        };
        // The first item is written at once.
        let first = tokio::spawn({
            let (commit, writes, gate) = (commit.clone(), writes.clone(), gate.clone());
            async move { commit.submit(1, write(writes, gate), Vec::new).await }
        });
        while writes.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Five arrive while it is in flight.
        let mut later = Vec::new();
        for item in 2..=6 {
            let (commit, writes, gate) = (commit.clone(), writes.clone(), gate.clone());
            later.push(tokio::spawn(async move {
                commit.submit(item, write(writes, gate), Vec::new).await
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(writes.load(Ordering::SeqCst), 1);
        release.send(true).expect("open");
        assert_eq!(first.await.expect("first"), vec![1]);
        for task in later {
            let mut batch = task.await.expect("later");
            batch.sort_unstable();
            assert_eq!(batch, vec![2, 3, 4, 5, 6]);
        }
        // One write for the first item, one for the five together.
        assert_eq!(writes.load(Ordering::SeqCst), 2);
    }
}
