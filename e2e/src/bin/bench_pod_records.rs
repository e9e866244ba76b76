//! What one synced pod's two cache records take on the heap: the tenant's pod and its super copy, read the
//! way the syncer's caches read them (the watch's JSON into `TenantPod` and `SuperPod`, then the stores'
//! trim). Prints bytes per record and per part, as the program asked for them and as glibc's chunks would
//! hold them (estimated), and the number of allocations.
//!
//! The pods are JSON files as an apiserver returns them (`kubectl get pod -o json`); the defaults are a
//! `bench_syncer` pod and its super copy, Running, taken from Kubernetes v1.33.3
//! (`e2e/fixtures/tenant-pod.json`, `e2e/fixtures/super-pod.json`). The records are made from one pod, so
//! what pods alike share (their spec but the node, tolerations, conditions) is counted once over them all;
//! the rows in parentheses show what a part takes where no other pod shares it. `bench_syncer` measures what the
//! whole syncer holds per pod; this shows the records' share and moves with every change to them, in a
//! second: `cargo run --release -p e2e --bin bench_pod_records`.

use std::{alloc::System, path::PathBuf};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use syncer::{
    cache::meta::PackedMeta,
    cache::pods::{CachedPodSpec, PackedStatus, SharedSpec, SuperPod, TenantPod, TenantPodStatus},
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Heap in use: bytes asked for, allocations, and glibc's chunks for them estimated (a request of n bytes
/// takes n + 8 rounded up to 16, and 32 at least: about 16 bytes more per allocation on average).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Heap {
    asked: isize,
    chunks: isize,
    allocations: isize,
}

fn heap() -> Heap {
    let stats = GLOBAL.stats();
    // A reallocation counts its growth as allocated, its shrinking as deallocated.
    let asked = stats.bytes_allocated as isize - stats.bytes_deallocated as isize;
    let allocations = stats.allocations as isize - stats.deallocations as isize;
    Heap {
        asked,
        chunks: asked + 16 * allocations,
        allocations,
    }
}

/// What `make` leaves on the heap per value kept, over `count` values (the record's own struct included,
/// as a store holds each record behind an `Arc`).
fn kept<T>(count: usize, make: impl Fn() -> anyhow::Result<T>) -> anyhow::Result<Heap> {
    let mut values = Vec::with_capacity(count);
    let vector = heap();
    for _ in 0..count {
        values.push(std::sync::Arc::new(make()?));
    }
    let after = heap();
    drop(values);
    let per = |f: fn(&Heap) -> isize| (f(&after) - f(&vector)) / count as isize;
    Ok(Heap {
        asked: per(|h| h.asked),
        chunks: per(|h| h.chunks),
        allocations: per(|h| h.allocations),
    })
}

/// [`kept`] of values read from `json`.
fn kept_parsed<T: serde::de::DeserializeOwned>(count: usize, json: &str) -> anyhow::Result<Heap> {
    kept(count, || Ok(serde_json::from_str::<T>(json)?))
}

impl std::ops::Add for Heap {
    type Output = Heap;

    fn add(self, other: Heap) -> Heap {
        Heap {
            asked: self.asked + other.asked,
            chunks: self.chunks + other.chunks,
            allocations: self.allocations + other.allocations,
        }
    }
}

#[derive(Parser, Debug)]
#[command(about = "Heap bytes of a synced pod's two cache records, by part")]
struct Args {
    /// The tenant's pod as JSON.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/tenant-pod.json"))]
    tenant_pod: PathBuf,
    /// Its super copy as JSON.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/super-pod.json"))]
    super_pod: PathBuf,
    /// Records made of each to average over.
    #[arg(long, default_value_t = 1000)]
    count: usize,
}

fn row(part: &str, heap: Heap) {
    println!(
        "| {part} | {} | {} | {} |",
        heap.asked, heap.chunks, heap.allocations
    );
}

/// A record's spec as kept (shared with the other records, all made from one pod), and what it would take
/// were it shared with none.
fn spec_rows(count: usize, spec: &str) -> anyhow::Result<()> {
    row(
        "  its spec (shared with pods alike)",
        kept_parsed::<CachedPodSpec>(count, spec)?,
    );
    row(
        "  (its spec's shared part, when no pod is alike)",
        kept_parsed::<SharedSpec>(count, spec)?,
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let read = |path: &PathBuf| -> anyhow::Result<serde_json::Value> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
    };
    let (tenant, super_copy) = (read(&args.tenant_pod)?, read(&args.super_pod)?);
    let (tenant_text, super_text) = (tenant.to_string(), super_copy.to_string());
    let count = args.count.max(1);

    let tenant_record = kept(count, || {
        // Read as its watch reads it, then packed as the cache keeps it.
        let pod: TenantPod = serde_json::from_str(&tenant_text)?;
        Ok(pod)
    })?;
    let super_record = kept(count, || {
        // Read as its watch reads it, then packed as the cache keeps it.
        let pod: SuperPod = serde_json::from_str(&super_text)?;
        Ok(pod)
    })?;
    let meta = |pod: &serde_json::Value| {
        let text = pod["metadata"].to_string();
        move || -> anyhow::Result<ObjectMeta> {
            let mut meta: ObjectMeta = serde_json::from_str(&text)?;
            syncer::cache::stores::trim_meta(&mut meta);
            Ok(meta)
        }
    };
    let packed_meta = |pod: &serde_json::Value| {
        let text = pod["metadata"].to_string();
        move || -> anyhow::Result<PackedMeta> {
            let meta: ObjectMeta = serde_json::from_str(&text)?;
            Ok(PackedMeta::from(meta))
        }
    };
    let part = |pod: &serde_json::Value, key: &str| pod[key].to_string();
    let (tenant_spec, tenant_status, super_spec, super_status) = (
        part(&tenant, "spec"),
        part(&tenant, "status"),
        part(&super_copy, "spec"),
        part(&super_copy, "status"),
    );

    println!(
        "heap per record, mean of {count} (tenant pod {} B of JSON, super pod {} B)",
        tenant_text.len(),
        super_text.len()
    );
    println!("| record or part | bytes asked for | with glibc's chunk overhead (est.) | allocations |");
    println!("|---|---|---|---|");
    row("tenant pod record", tenant_record);
    row("  its metadata (packed)", kept(count, packed_meta(&tenant))?);
    row("  (its metadata as an ObjectMeta)", kept(count, meta(&tenant))?);
    spec_rows(count, &tenant_spec)?;
    row(
        "  its status",
        kept_parsed::<TenantPodStatus>(count, &tenant_status)?,
    );
    row("super pod record", super_record);
    row("  its metadata (packed)", kept(count, packed_meta(&super_copy))?);
    row(
        "  (its metadata as an ObjectMeta)",
        kept(count, meta(&super_copy))?,
    );
    spec_rows(count, &super_spec)?;
    row(
        "  its status (compressed)",
        kept(count, || Ok(PackedStatus::new(&super_status)))?,
    );
    row(
        "  (its status as JSON)",
        kept_parsed::<Box<serde_json::value::RawValue>>(count, &super_status)?,
    );
    row("both records", tenant_record + super_record);
    Ok(())
}
