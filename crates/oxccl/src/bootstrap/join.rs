//! Joining: a rank's request to the root and the answer it waits for, the table relayed
//! down the relay tree in a sparse bootstrap ([`relay_links`]), and the wait for it.

use super::*;

/// The relay tree that carries the peer table in a sparse bootstrap: a binary heap over rank
/// numbers (rank 0 at the top, which the root sends the table to): `(parent, children)`.
pub fn relay_links(me: Rank, size: usize) -> (Option<Rank>, Vec<Rank>) {
    let r = me.idx();
    let parent = (r > 0).then(|| Rank::new((r - 1) / 2));
    let children = [2 * r + 1, 2 * r + 2].into_iter().filter(|c| *c < size).map(Rank::new).collect();
    (parent, children)
}

/// What joining gives a rank.
pub(crate) struct Joined {
    /// The peer table, in rank order.
    pub peers: Vec<PeerInfo>,
    pub route: Route,
    /// Control connections opened while joining (a sparse bootstrap's relay to this rank's
    /// children), hello sent: the first of the rank's lifelines.
    pub links: HashMap<u32, TcpStream>,
}

/// Where and how a rank joins: its root's address and secret (the communicator's is root 0's,
/// `place.root0_secret`), the communicator's size, this
/// rank's sparse-bootstrap threshold (rank 0's decides), and where its root stands among the
/// communicator's roots (`roots`: every root's address, for messages).
#[derive(Clone, Copy)]
pub(crate) struct Rendezvous<'a> {
    pub root: SocketAddr,
    pub secret: &'a [u8; 32],
    pub size: usize,
    pub sparse_from: usize,
    pub place: &'a super::roots::Place,
    pub roots: &'a [SocketAddr],
}

impl Rendezvous<'_> {
    /// This rank's root, for messages: "the rendezvous root at ADDR", or with several roots
    /// "rendezvous root K of R (commIds[K]) at ADDR".
    fn name(&self) -> String {
        self.name_of(self.place.index as usize)
    }

    fn name_of(&self, k: usize) -> String {
        let addr = self.roots.get(k).map_or("?".to_string(), |a| a.to_string());
        if self.place.nroots <= 1 {
            format!("the rendezvous root at {addr}")
        } else {
            format!("rendezvous root {k} of {} (commIds[{k}]) at {addr}", self.place.nroots)
        }
    }

    /// Whose process runs this rank's root, for messages.
    fn runs_root(&self) -> String {
        match self.place.index {
            _ if self.place.nroots <= 1 => "rank 0's process".into(),
            k => format!("the process that made commIds[{k}]"),
        }
    }
}

/// Joins the root at `rv.root`: the peer table, from the root or (a sparse bootstrap) from this
/// rank's parent in the relay tree, which it forwards to its own children. `mailbox` is this
/// rank's service's, where a relayed table arrives; `w` should watch it, so a parent whose
/// process ends before it relays is named at once.
pub(crate) fn join(
    rv: Rendezvous<'_>,
    info: &PeerInfo,
    mailbox: &Mailbox,
    w: &Waiter,
    log: &crate::log::Logger,
) -> Result<Joined> {
    let Rendezvous { root, secret, size, sparse_from, place, .. } = rv;
    let name = rv.name();
    let what = format!("bootstrap: reaching {name} (nothing listens there yet)");
    let first = Rank::new(super::roots::share(place.index as usize, size, place.nroots as usize).start);
    let req = Join {
        version: PROTOCOL_VERSION,
        secret: *secret,
        rank: info.rank.0,
        nranks: size as u32,
        sparse_from: sparse_from.min(u32::MAX as usize) as u32,
        place: place.clone(),
        info: info.clone(),
    };
    let mut s = join_root(root, &req.encode(), w, &what)?;
    // Until the route comes, the root's status frames say who has not joined yet: a timeout
    // names them.
    let mut missing: Vec<Rank> = Vec::new();
    let mut roots: Vec<u32> = Vec::new();
    let next = |s: &mut TcpStream, missing: &mut Vec<Rank>, roots: &mut Vec<u32>| -> Result<(u8, Vec<u8>)> {
        loop {
            let what = if !roots.is_empty() {
                let list: Vec<String> = roots.iter().map(|k| rv.name_of(*k as usize)).collect();
                format!(
                    "bootstrap: waiting at {name}{} for {} to report {} ranks",
                    if missing.is_empty() { "" } else { " (and for missing ranks)" },
                    list.join(", "),
                    if roots.len() == 1 { "its" } else { "their" }
                )
            } else if missing.is_empty() {
                format!("bootstrap: waiting for every rank to join at {name} (it has not yet said which ranks it misses)")
            } else {
                format!("bootstrap: waiting for the missing ranks to join at {name}")
            };
            let (k, payload) = read_frame(s, w, &what, missing).map_err(|e| match e {
                    // The root lives in rank 0's process: a reset or an end of stream before
                    // its answer means that process ended (often after a failed rendezvous,
                    // which the ranks that had joined by then were told).
                    Error::Io { source, .. }
                        if matches!(
                            source.kind(),
                            io::ErrorKind::ConnectionReset
                                | io::ErrorKind::UnexpectedEof
                                | io::ErrorKind::BrokenPipe
                                | io::ErrorKind::ConnectionAborted
                        ) =>
                    {
                        Error::PeerClosed {
                            rank: w.rank,
                            op: format!(
                                "bootstrap: waiting for the answer of {name} (it runs in {}, which ended before answering: see its error)",
                                rv.runs_root()
                            ),
                            peer: first,
                            host: root.to_string(),
                        }
                    }
                    e => e,
                })?;
            match k {
                kind::STATUS => {
                    let st = JoinStatus::decode(&payload)?;
                    (*missing, *roots) = (st.missing, st.roots);
                }
                kind::REJECT => {
                    return Err(Error::Rejected { rank: w.rank, reason: decode_reject(&payload)? })
                }
                _ => return Ok((k, payload)),
            }
        }
    };
    let unexpected = |k: u8| -> Error {
        CoreError::Malformed { what: "root reply", reason: format!("frame kind {k}") }.into()
    };
    let (k, payload) = next(&mut s, &mut missing, &mut roots)?;
    if k != kind::ROUTE {
        return Err(unexpected(k));
    }
    let route = Route::decode(&payload)?;
    let (parent, children) = relay_links(info.rank, size);
    let table = match (route.sparse, parent) {
        (false, _) | (true, None) => match next(&mut s, &mut missing, &mut roots)? {
            (kind::TABLE, t) => t,
            (k, _) => return Err(unexpected(k)),
        },
        (true, Some(_)) => {
            drop(s);
            await_table(info.rank, &route.ancestors, mailbox, w)?
        }
    };
    let decode = |table: &[u8]| -> Result<Vec<PeerInfo>> {
        let peers = decode_table(table)?;
        if peers.len() != size || peers.iter().enumerate().any(|(i, p)| p.rank.idx() != i) {
            return Err(Error::Internal(format!(
                "bootstrap: a peer table of {} entries for world size {size}",
                peers.len()
            )));
        }
        Ok(peers)
    };
    // Relayed first, decoded after: the children's addresses come with the route; the table
    // is decoded early only to find grandchildren past a child that is gone.
    let mut peers: Option<Vec<PeerInfo>> = None;
    let mut links = HashMap::new();
    if route.sparse {
        if route.children.len() != children.len() {
            return Err(CoreError::Malformed {
                what: "route",
                reason: format!(
                    "{} children's addresses for {} children",
                    route.children.len(),
                    children.len()
                ),
            }
            .into());
        }
        let direct: HashMap<Rank, SocketAddr> =
            children.iter().copied().zip(route.children.iter().copied()).collect();
        let mut msg = Writer::new();
        msg.u64(TAG_TABLE).raw(&table);
        let msg = msg.finish();
        // A child that is gone is skipped: its children get the table from this rank (and
        // so on down), so one rank's death costs no other rank its table. Its death is found
        // again (and named, and told) when the lifelines open.
        let mut todo: Vec<Rank> = children;
        while let Some(c) = todo.pop() {
            let op = "bootstrap: relaying the peer table down the relay tree";
            let addr = match direct.get(&c) {
                Some(a) => *a,
                None => {
                    let p = match peers.take() {
                        Some(p) => p,
                        None => decode(&table)?,
                    };
                    let a = p[c.idx()].addr;
                    peers = Some(p);
                    a
                }
            };
            let sent = (|| -> Result<Option<TcpStream>> {
                // The child's service listened before it joined: a refusal means its process
                // has ended.
                let mut cs = match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    Ok(cs) => cs,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Ok(None),
                    Err(_) => connect_retry(addr, w, op, &[c])?,
                };
                let _ = cs.set_nodelay(true);
                // The communicator's secret (root 0's id), not this rank's root's.
                let hello = Hello { secret: place.root0_secret, from: info.rank, to: c, data: None };
                let wrote =
                    write_frame_within(&mut cs, kind::HELLO, &hello.encode(), w, "bootstrap hello", c)
                        .and_then(|_| write_frame_within(&mut cs, kind::MSG, &msg, w, op, c));
                match wrote {
                    Ok(()) => Ok(Some(cs)),
                    // Reset or closed under the write: gone.
                    Err(Error::Io { source, .. })
                        if matches!(
                            source.kind(),
                            io::ErrorKind::ConnectionReset
                                | io::ErrorKind::BrokenPipe
                                | io::ErrorKind::WriteZero
                        ) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })()?;
            match sent {
                Some(cs) => {
                    links.insert(c.0, cs);
                }
                None => {
                    log.warn(format_args!(
                        "bootstrap: rank {c} is gone (its service refuses connections); relaying the peer table past it to its children"
                    ));
                    todo.extend(relay_links(c, size).1);
                }
            }
        }
    }
    let peers = match peers {
        Some(p) => p,
        None => decode(&table)?,
    };
    Ok(Joined { peers, route, links })
}

/// How long a rank whose parent in the relay tree is gone waits for an ancestor to relay
/// the table past it before it gives up, naming the parent.
pub(super) const ORPHAN_GRACE_MS: u64 = 10_000;

/// A sparse bootstrap's wait for the table: from this rank's parent in the relay tree, or
/// from a live ancestor that relays past a parent that is gone. Ends with an error naming
/// the parent once the parent and every ancestor refuse connections (their processes
/// ended), once the parent's connection ends mid-relay, after `ORPHAN_GRACE_MS` without a
/// parent, or at the deadline.
fn await_table(me: Rank, addrs: &[SocketAddr], mailbox: &Mailbox, w: &Waiter) -> Result<Vec<u8>> {
    let chain = Route::ancestors_of(me);
    let parent = chain[0];
    let what = format!(
        "bootstrap: waiting for the peer table from rank {parent}, this rank's parent in the relay tree"
    );
    let mut next_look = Instant::now() + Duration::from_millis(RELAY_LOOK_AFTER_MS);
    // The nearest ancestor not known to be gone, and since when the parent is.
    let (mut k, mut orphan_since) = (0usize, None::<Instant>);
    let gone = |why: String| Error::PeerClosed {
        rank: me,
        op: format!("{what}: {why}"),
        peer: parent,
        host: "?".into(),
    };
    loop {
        if let Some(t) = mailbox.take_any_within(&chain, TAG_TABLE, w.slice().min(Duration::from_millis(50)))
        {
            return Ok(t);
        }
        w.check(&what, &[parent])?;
        if Instant::now() < next_look {
            continue;
        }
        next_look = Instant::now() + Duration::from_millis(RELAY_LOOK_EVERY_MS);
        while let Some(a) = addrs.get(k) {
            match TcpStream::connect_timeout(a, Duration::from_millis(200)) {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => k += 1,
                _ => break,
            }
        }
        if k > 0 && k >= addrs.len().min(chain.len()) {
            // Every rank above fails once the topmost is gone (none of them gets the
            // table): that one is the cause.
            let top = chain[k - 1];
            return Err(Error::PeerClosed {
                rank: me,
                op: format!(
                    "{what}: rank {top} at the top of this rank's branch of the tree is gone (its service refuses connections), so none below it has the table"
                ),
                peer: top,
                host: "?".into(),
            });
        }
        if k > 0 {
            let since = *orphan_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_millis(ORPHAN_GRACE_MS) {
                return Err(gone(format!(
                    "its service refuses connections (its process ended), and rank {} above it did not relay past it within {ORPHAN_GRACE_MS} ms",
                    chain[k]
                )));
            }
        }
    }
}
