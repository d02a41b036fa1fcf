//! Connecting: the connections a job needs, shared memory with same-host peers and TCP with
//! the others, set up through the peers' services and kept for later jobs.

use super::*;

/// A connection class as log lines name it (`Channel 00`, `Tree 1`, …).
fn class_name(c: ConnClass) -> String {
    match c {
        ConnClass::Ring(ch) => format!("Channel {:02}", ch.0),
        ConnClass::Tree(t) => format!("Tree {t}"),
        ConnClass::Direct => "Direct".into(),
        ConnClass::P2p => "P2P".into(),
        ConnClass::Rma => "RMA".into(),
    }
}

impl Engine {
    fn uses_shm(&self, peer: &PeerInfo) -> bool {
        !self.ctx.shm_disable && peer.host_id == self.ctx.host_id
    }

    fn remember(&self, s: Option<TcpStream>) {
        if let Some(s) = s {
            self.sockets.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        }
    }

    /// Establishes every connection in `needed` that does not exist yet.
    ///
    /// Shared memory: outbound rings are created here and announced; inbound ones are the
    /// peer's announcements. TCP: one stream per (peer, class) carries both directions; the
    /// lower rank connects, the higher accepts, and a direction not needed yet keeps its
    /// clone of the stream for later. Streams this rank opens come first (they never wait for
    /// the peer's engine), then the ones it waits for.
    pub fn connect(&mut self, needed: &[(ConnKey, bool)], w: &Waiter) -> Result<()> {
        let missing: Vec<(ConnKey, bool)> = needed
            .iter()
            .filter(|(k, out)| if *out { !self.sends.contains_key(k) } else { !self.recvs.contains_key(k) })
            .copied()
            .collect();
        let me = self.ctx.me;
        let (active, passive): (Vec<_>, Vec<_>) = missing.iter().partition(|(k, out)| {
            let shm = self.uses_shm(&self.ctx.peers[k.peer.idx()]);
            if shm {
                *out
            } else {
                me < k.peer
            }
        });
        for &(key, out) in active.iter().chain(passive.iter()) {
            let c = &self.ctx;
            let peer = &c.peers[key.peer.idx()];
            if self.uses_shm(peer) {
                if out {
                    let conn = SendConn::Shm(ShmSend::connect(
                        c.me,
                        &c.secret,
                        peer,
                        key.class,
                        c.slots,
                        c.slot_bytes,
                        &c.doorbell,
                    )?);
                    // The slots on this rank's NUMA node. A kernel or sandbox that refuses
                    // leaves first-touch placement, and says so.
                    if let (Some(n), SendConn::Shm(sc)) = (c.numa, &conn) {
                        if let Err(e) = sc.prefer_node(n) {
                            c.log.info_in(
                                subsys::SHM,
                                format_args!(
                                    "connection {} -> {} left on first-touch placement: {e}",
                                    c.me, key.peer
                                ),
                            );
                        }
                    }
                    c.log.info_in(
                        subsys::INIT | subsys::SHM,
                        format_args!(
                            "{} : {} -> {} via SHM ({} slots × {} KiB; same host {})",
                            class_name(key.class),
                            c.me,
                            key.peer,
                            c.slots,
                            c.slot_bytes >> 10,
                            peer.hostname
                        ),
                    );
                    self.sends.insert(key, conn);
                } else {
                    let offer = match c.mailbox.wait_conn(key.peer, key.class, w)? {
                        Incoming::Host(o) => o.downcast::<ShmOffer>().ok(),
                        Incoming::Tcp(_) => None,
                    };
                    let Some(o) = offer else {
                        return Err(Error::Internal(format!(
                            "rank {} offered another kind of connection where this rank expects shared memory",
                            key.peer
                        )));
                    };
                    let conn = RecvConn::Shm(ShmRecv::accept(c.me, key.peer, *o, c.slots, c.slot_bytes)?);
                    self.recvs.insert(key, conn);
                }
                continue;
            }
            let stream = match self.spare.remove(&key) {
                Some(s) => s,
                None => {
                    let s = if me < key.peer {
                        TcpSend::connect_stream(
                            c.me,
                            &c.secret,
                            peer,
                            key.class,
                            c.peers[c.me.idx()].rails.len(),
                            w,
                        )?
                    } else {
                        match c.mailbox.wait_conn(key.peer, key.class, w)? {
                            Incoming::Tcp(s) => s,
                            Incoming::Host(_) => {
                                return Err(Error::Internal(format!(
                                    "rank {} offered shared memory where this rank expects TCP",
                                    key.peer
                                )))
                            }
                        }
                    };
                    let why = if self.ctx.shm_disable && peer.host_id == self.ctx.host_id {
                        "NCCL_SHM_DISABLE=1".to_string()
                    } else {
                        format!("rank {} is on host {}", key.peer, peer.hostname)
                    };
                    let rails = c.peers[c.me.idx()].rails.len().min(peer.rails.len());
                    let why = if rails > 1 {
                        let r = crate::transport::tcp::rail_of(key.class, rails);
                        format!("{why}; rail {r} of {rails}: {}", peer.rails[r])
                    } else {
                        why
                    };
                    c.log.info_in(
                        subsys::INIT | subsys::NET,
                        format_args!(
                            "{} : {} <-> {} via NET/Socket ({} slots × {} KiB; {why})",
                            class_name(key.class),
                            c.me,
                            key.peer,
                            c.slots,
                            c.slot_bytes >> 10
                        ),
                    );
                    let other = s
                        .try_clone()
                        .map_err(|e| Error::io(c.me, "TCP connection setup", Some(key.peer), e))?;
                    self.remember(s.try_clone().ok());
                    self.spare.insert(key, other);
                    s
                }
            };
            if out {
                let conn = TcpSend::over(c.me, peer, stream, c.slots, c.slot_bytes)?;
                self.sends.insert(key, SendConn::Tcp(conn));
            } else {
                let conn = TcpRecv::accept(c.me, peer, stream, c.slots, c.slot_bytes)?;
                self.recvs.insert(key, RecvConn::Tcp(conn));
            }
        }
        Ok(())
    }
}
