//! Connections by peer address, so that one client cannot hold every slot. Each
//! connection says whether a request is in flight on it and since when it has been
//! idle (a connection that never sent a request head is idle since it was accepted).
//! When the slots run out, an idle connection makes room before anyone waits: the
//! oldest idle one of a peer holding more than its share, else the oldest idle one of
//! any kind. A connection with a request in flight is never shed. When set, a peer
//! holds at most `limits.max_connections_per_peer` connections.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use handoff_plugin_api::CancellationToken;

/// What one connection is doing, updated by its requests without a lock.
#[derive(Debug)]
pub struct ConnectionState {
    in_flight: AtomicUsize,
    /// [`now_ms`] when the last request ended (or it was accepted).
    idle_since: AtomicU64,
    spoke: AtomicBool,
}

impl ConnectionState {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(now_ms()),
            spoke: AtomicBool::new(false),
        }
    }

    /// A request started on the connection; the guard ends it when dropped.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.spoke.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// True when a request head arrived on it.
    pub fn spoke(&self) -> bool {
        self.spoke.load(Ordering::Relaxed)
    }

    /// How long it has had no request in flight; `None` while one is.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.idle_since.load(Ordering::Relaxed);
        Some(Duration::from_millis(now_ms().saturating_sub(since)))
    }
}

/// One request in flight on a connection: from its head to the end of its response.
#[derive(Debug)]
pub struct InFlight(Arc<ConnectionState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.idle_since.store(now_ms(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Milliseconds since the first call, a clock every connection shares.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    state: Arc<ConnectionState>,
    shed: CancellationToken,
}

#[derive(Debug, Default)]
struct Table {
    open: HashMap<IpAddr, usize>,
    /// Every open connection, by serial.
    connections: BTreeMap<u64, Entry>,
    next: u64,
}

impl Table {
    /// The connection to shed, if one is idle: among `ip`'s when given, else the
    /// oldest idle one of a peer over `share`, else the oldest idle one.
    fn pick(&self, ip: Option<IpAddr>, share: usize) -> Option<u64> {
        let idle = self.connections.iter().filter_map(|(serial, entry)| {
            let idle_for = entry.state.idle_for()?;
            let wanted = !entry.shed.is_cancelled() && ip.is_none_or(|ip| ip == entry.ip);
            wanted.then_some((*serial, entry.ip, idle_for))
        });
        let over_share = |peer: &IpAddr| self.open.get(peer).copied().unwrap_or(0) > share;
        let mut oldest = None;
        let mut oldest_over = None;
        for (serial, peer, idle_for) in idle {
            if oldest.is_none_or(|(_, longest)| idle_for > longest) {
                oldest = Some((serial, idle_for));
            }
            if over_share(&peer) && oldest_over.is_none_or(|(_, longest)| idle_for > longest) {
                oldest_over = Some((serial, idle_for));
            }
        }
        oldest_over.or(oldest).map(|(serial, _)| serial)
    }
}

/// The open connections of every peer.
#[derive(Debug)]
pub struct Peers {
    table: Mutex<Table>,
    per_peer: usize,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Admitted {
    peers: Arc<Peers>,
    ip: IpAddr,
    serial: u64,
    /// What its requests are doing.
    pub state: Arc<ConnectionState>,
    /// Cancelled when the connection is shed: it closes once it is idle.
    pub shed: CancellationToken,
}

impl Peers {
    /// A table allowing `per_peer` connections to each address (0: any number).
    pub fn new(per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::default(),
            per_peer: if per_peer == 0 { usize::MAX } else { per_peer },
        })
    }

    /// Admits a connection from `ip`. A peer at its cap first loses its own oldest
    /// idle connection; with none, the new one is refused (`None`).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Admitted> {
        let mut table = self.table.lock().ok()?;
        if table.open.get(&ip).copied().unwrap_or(0) >= self.per_peer {
            let oldest = table.pick(Some(ip), usize::MAX)?;
            if let Some(entry) = table.connections.get(&oldest) {
                entry.shed.cancel();
            }
        }
        let serial = table.next;
        table.next += 1;
        *table.open.entry(ip).or_insert(0) += 1;
        let state = Arc::new(ConnectionState::new());
        let shed = CancellationToken::new();
        table.connections.insert(
            serial,
            Entry {
                ip,
                state: Arc::clone(&state),
                shed: shed.clone(),
            },
        );
        Some(Admitted {
            peers: Arc::clone(self),
            ip,
            serial,
            state,
            shed,
        })
    }

    /// Every slot is taken: sheds the oldest idle connection of a peer holding more
    /// than its share of the `slots`, else the oldest idle one; false when none is idle.
    pub fn shed_idle(&self, slots: usize) -> bool {
        let Ok(table) = self.table.lock() else {
            return false;
        };
        let share = slots / table.open.len().max(1);
        let Some(serial) = table.pick(None, share) else {
            return false;
        };
        table
            .connections
            .get(&serial)
            .map(|entry| entry.shed.cancel())
            .is_some()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Ok(mut table) = self.peers.table.lock() {
            table.connections.remove(&self.serial);
            if let Some(open) = table.open.get_mut(&self.ip) {
                *open -= 1;
                if *open == 0 {
                    table.open.remove(&self.ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_at_its_cap_loses_its_idle_connections_first() {
        let peers = Peers::new(2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let first = peers.admit(a).unwrap();
        let second = peers.admit(a).unwrap();
        let busy = second.state.start();
        // The third sheds the first (idle), never the second (a request in flight).
        let third = peers.admit(a).unwrap();
        assert!(first.shed.is_cancelled());
        assert!(!second.shed.is_cancelled());
        drop(first);
        let _also_busy = third.state.start();
        assert!(peers.admit(a).is_none(), "at the cap with nothing idle");
        let other = peers.admit(b).unwrap();
        assert!(peers.shed_idle(8));
        assert!(other.shed.is_cancelled());
        assert!(!peers.shed_idle(8));
        // Once its request ends, the second is idle and may go.
        drop(busy);
        assert!(second.state.idle_for().is_some());
        assert!(peers.shed_idle(8));
        assert!(second.shed.is_cancelled());
    }

    #[test]
    fn a_peer_over_its_share_gives_way_before_an_older_idle_one() {
        let peers = Peers::new(0);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let lone = peers.admit(b).unwrap();
        let hogs: Vec<Admitted> = (0..3).map(|_| peers.admit(a).unwrap()).collect();
        // Four slots, two peers: a holds three, over its share of two.
        assert!(peers.shed_idle(4));
        assert!(!lone.shed.is_cancelled());
        assert_eq!(hogs.iter().filter(|hog| hog.shed.is_cancelled()).count(), 1);
    }
}
