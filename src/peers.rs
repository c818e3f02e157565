//! Connections by peer address, so that one client cannot hold every slot: when the
//! slots run out, the busiest peer's oldest connection that has not sent a request
//! head yet (a silent socket) is closed to make room, before anyone waits; and, when
//! set, at most `limits.max_connections_per_peer` each.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use handoff_plugin_api::CancellationToken;

#[derive(Debug, Default)]
struct Table {
    open: HashMap<IpAddr, usize>,
    /// Connections that have sent nothing yet, oldest first.
    silent: BTreeMap<u64, (IpAddr, CancellationToken)>,
    next: u64,
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
    /// Cancelled when the connection is shed.
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
    /// silent connection; with none, the new one is refused (`None`).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Admitted> {
        let mut table = self.table.lock().ok()?;
        if table.open.get(&ip).copied().unwrap_or(0) >= self.per_peer {
            let oldest = table
                .silent
                .iter()
                .find(|(_, (owner, _))| *owner == ip)
                .map(|(serial, _)| *serial)?;
            if let Some((_, token)) = table.silent.remove(&oldest) {
                token.cancel();
            }
        }
        let serial = table.next;
        table.next += 1;
        *table.open.entry(ip).or_insert(0) += 1;
        let shed = CancellationToken::new();
        table.silent.insert(serial, (ip, shed.clone()));
        Some(Admitted {
            peers: Arc::clone(self),
            ip,
            serial,
            shed,
        })
    }

    /// Closes the oldest silent connection of the peer holding the most connections;
    /// false when no connection is silent.
    pub fn shed_silent(&self) -> bool {
        let Ok(mut table) = self.table.lock() else {
            return false;
        };
        let busiest = table
            .silent
            .values()
            .map(|(ip, _)| *ip)
            .max_by_key(|ip| table.open.get(ip).copied().unwrap_or(0));
        let Some(busiest) = busiest else {
            return false;
        };
        let oldest = table
            .silent
            .iter()
            .find(|(_, (ip, _))| *ip == busiest)
            .map(|(serial, _)| *serial);
        match oldest.and_then(|serial| table.silent.remove(&serial)) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

impl Admitted {
    /// The connection sent a request head: it is no longer silent, never shed.
    pub fn spoke(&self) {
        if let Ok(mut table) = self.peers.table.lock() {
            table.silent.remove(&self.serial);
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Ok(mut table) = self.peers.table.lock() {
            table.silent.remove(&self.serial);
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
    fn a_peer_at_its_cap_loses_its_silent_sockets_first() {
        let peers = Peers::new(2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let first = peers.admit(a).unwrap();
        let second = peers.admit(a).unwrap();
        second.spoke();
        // The third sheds the first (silent), never the second (it spoke).
        let third = peers.admit(a).unwrap();
        assert!(first.shed.is_cancelled());
        assert!(!second.shed.is_cancelled());
        drop(first);
        third.spoke();
        assert!(peers.admit(a).is_none(), "at the cap with nothing silent");
        let other = peers.admit(b).unwrap();
        assert!(peers.shed_silent());
        assert!(other.shed.is_cancelled());
        assert!(!peers.shed_silent());
    }
}
