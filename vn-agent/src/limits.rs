//! What one caller may hold of vn-agent at once: connections, overall and per source address, and open
//! streams (exec, attach, port-forward) per tenant. vn-agent is shared by every tenant with pods on its
//! node, so without these one tenant's apiserver (or anyone who can reach the port) could hold every file
//! descriptor and task of it and refuse everyone else's `kubectl logs` and `exec`.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

/// The caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, from everyone.
    pub connections: usize,
    /// Connections open at once from one source address.
    pub connections_per_source: usize,
    /// Upgraded streams (exec, attach, port-forward) open at once for one tenant.
    pub streams_per_tenant: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 4096,
            connections_per_source: 512,
            streams_per_tenant: 128,
        }
    }
}

/// Why a connection is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Every connection slot is taken.
    Full,
    /// The source address holds its share.
    Source,
}

impl Refused {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Full => "connections",
            Self::Source => "connections_per_source",
        }
    }
}

#[derive(Debug, Default)]
struct Held {
    connections: usize,
    by_source: HashMap<IpAddr, usize>,
    by_tenant: HashMap<String, usize>,
}

/// Counts what is held against [`Limits`].
#[derive(Debug)]
pub struct Gate {
    limits: Limits,
    held: Mutex<Held>,
}

/// A connection slot, given back when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    gate: Arc<Gate>,
    source: IpAddr,
}

/// A stream slot of a tenant, given back when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    gate: Arc<Gate>,
    tenant: String,
}

impl Gate {
    /// A gate with nothing held.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            held: Mutex::default(),
        })
    }

    /// The caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection slot for `source`, or why there is none.
    pub fn connection(self: &Arc<Self>, source: IpAddr) -> Result<ConnectionSlot, Refused> {
        let mut held = self.held();
        if held.connections >= self.limits.connections {
            return Err(Refused::Full);
        }
        let from_source = held.by_source.entry(source).or_default();
        if *from_source >= self.limits.connections_per_source {
            return Err(Refused::Source);
        }
        *from_source += 1;
        held.connections += 1;
        Ok(ConnectionSlot {
            gate: self.clone(),
            source,
        })
    }

    /// A stream slot for `tenant`, unless it holds its share.
    pub fn stream(self: &Arc<Self>, tenant: &str) -> Option<StreamSlot> {
        let mut held = self.held();
        let streams = held.by_tenant.entry(tenant.to_owned()).or_default();
        if *streams >= self.limits.streams_per_tenant {
            return None;
        }
        *streams += 1;
        Some(StreamSlot {
            gate: self.clone(),
            tenant: tenant.to_owned(),
        })
    }

    /// Connections held now.
    pub fn connections(&self) -> usize {
        self.held().connections
    }

    /// Streams a tenant holds now.
    pub fn streams(&self, tenant: &str) -> usize {
        self.held().by_tenant.get(tenant).copied().unwrap_or_default()
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut held = self.gate.held();
        held.connections = held.connections.saturating_sub(1);
        if let Some(count) = held.by_source.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                held.by_source.remove(&self.source);
            }
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut held = self.gate.held();
        if let Some(count) = held.by_tenant.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                held.by_tenant.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_overall_and_per_source_and_given_back() {
        let gate = Gate::new(Limits {
            connections: 3,
            connections_per_source: 2,
            streams_per_tenant: 1,
        });
        let a = IpAddr::from([10, 0, 0, 1]);
        let b = IpAddr::from([10, 0, 0, 2]);
        let first = gate.connection(a).expect("first");
        let _second = gate.connection(a).expect("second");
        assert_eq!(gate.connection(a).err(), Some(Refused::Source));
        let third = gate.connection(b).expect("another source");
        assert_eq!(gate.connection(b).err(), Some(Refused::Full));
        drop(first);
        assert_eq!(gate.connections(), 2);
        let _again = gate.connection(a).expect("a slot was given back");
        drop(third);
        assert!(gate.connection(b).is_ok());
    }

    #[test]
    fn streams_are_capped_per_tenant() {
        let gate = Gate::new(Limits {
            streams_per_tenant: 2,
            ..Limits::default()
        });
        let one = gate.stream("tenant-a").expect("one");
        let _two = gate.stream("tenant-a").expect("two");
        assert!(gate.stream("tenant-a").is_none(), "a third of the same tenant");
        let _other = gate.stream("tenant-b").expect("another tenant is not held up");
        drop(one);
        assert_eq!(gate.streams("tenant-a"), 1);
        assert!(gate.stream("tenant-a").is_some());
    }
}
