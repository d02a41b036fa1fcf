//! The bootstrap's messages and their codecs: a rank's [`PeerInfo`], the join request and
//! the root's answers (route, table, status, rejection), a data connection's hello. Decoding
//! is bounded and fails with a clear error, never a panic.

use super::*;

/// What a rank tells the others about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerInfo {
    pub rank: Rank,
    pub pid: u32,
    pub host_id: u64,
    pub hostname: String,
    /// The rank's service listener.
    pub addr: SocketAddr,
    /// The abstract name of the rank's Unix socket.
    pub unix_name: [u8; 16],
    /// The calibration of the rank's host (the tuner uses rank 0's on every rank).
    pub costs: oxccl_core::tuner::CpuCosts,
    /// The rank's CUDA device ordinal ([`Config::cuda_device`](oxccl_core::config::Config)),
    /// -1 when not known.
    pub cuda_device: i32,
    /// The rank's rails ([`oxccl_core::ifname::rails`]): one address per interface, in rail
    /// order, its service listening on each at `addr`'s port; empty: `addr` alone.
    pub rails: Vec<IpAddr>,
    /// The machine (kernel) the rank runs on ([`crate::sys::host::machine_id`]): ranks of
    /// several hosts (network namespaces, containers) of one machine share its cores.
    pub machine: u64,
    /// Each of the rank's rails' speed to other hosts, GB/s (`OXCCL_NET_GBIT`, else what the
    /// kernel reports for its interfaces); 0 where not known.
    pub nic_gbs: f64,
}

pub(crate) fn put_addr(w: &mut Writer, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            w.u8(4).raw(&ip.octets()).raw(&[0u8; 12]);
        }
        IpAddr::V6(ip) => {
            w.u8(6).raw(&ip.octets());
        }
    }
    w.u16(a.port());
}

pub(crate) fn get_addr(r: &mut Reader<'_>) -> Result<SocketAddr, CoreError> {
    let fam = r.u8()?;
    let b: [u8; 16] = r.fixed()?;
    let port = r.u16()?;
    let ip = match fam {
        4 => IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
        6 => IpAddr::V6(Ipv6Addr::from(b)),
        f => {
            return Err(CoreError::Malformed { what: "peer address", reason: format!("address family {f}") })
        }
    };
    Ok(SocketAddr::new(ip, port))
}

impl PeerInfo {
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u32(self.rank.0).u32(self.pid).u64(self.host_id).str(&self.hostname);
        put_addr(w, &self.addr);
        w.raw(&self.unix_name);
        let c = &self.costs;
        w.u64(c.copy_gbs.to_bits())
            .u64(c.hop_us.to_bits())
            .u64(c.tcp_us.to_bits())
            .u64(c.tcp_gbs.to_bits())
            .u64(c.ll_gbs.to_bits())
            .u64(c.ll128_gbs.to_bits())
            .u8(c.measured as u8);
        w.u32(self.cuda_device as u32);
        w.u8(self.rails.len().min(oxccl_core::ifname::MAX_RAILS) as u8);
        for ip in self.rails.iter().take(oxccl_core::ifname::MAX_RAILS) {
            put_addr(w, &SocketAddr::new(*ip, 0));
        }
        w.u64(self.machine).u64(self.nic_gbs.to_bits());
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<PeerInfo, CoreError> {
        Ok(PeerInfo {
            rank: Rank(r.u32()?),
            pid: r.u32()?,
            host_id: r.u64()?,
            hostname: r.str()?.to_string(),
            addr: get_addr(r)?,
            unix_name: r.fixed()?,
            costs: {
                let mut f = || -> Result<f64, CoreError> {
                    let v = f64::from_bits(r.u64()?);
                    if v.is_finite() && v > 0.0 {
                        Ok(v)
                    } else {
                        Err(CoreError::Malformed { what: "peer calibration", reason: format!("{v}") })
                    }
                };
                let (copy_gbs, hop_us, tcp_us, tcp_gbs) = (f()?, f()?, f()?, f()?);
                let (ll_gbs, ll128_gbs) = (f()?, f()?);
                oxccl_core::tuner::CpuCosts {
                    copy_gbs,
                    hop_us,
                    tcp_us,
                    tcp_gbs,
                    ll_gbs,
                    ll128_gbs,
                    measured: r.u8()? != 0,
                }
            },
            cuda_device: match r.u32()? as i32 {
                d if d >= -1 => d,
                d => return Err(CoreError::Malformed { what: "peer CUDA device", reason: format!("{d}") }),
            },
            rails: match r.u8()? as usize {
                n if n <= oxccl_core::ifname::MAX_RAILS => {
                    (0..n).map(|_| get_addr(r).map(|a| a.ip())).collect::<Result<_, _>>()?
                }
                n => {
                    return Err(CoreError::Malformed {
                        what: "peer rails",
                        reason: format!("{n} (at most {})", oxccl_core::ifname::MAX_RAILS),
                    })
                }
            },
            machine: r.u64()?,
            nic_gbs: match f64::from_bits(r.u64()?) {
                v if v.is_finite() && v >= 0.0 => v,
                v => {
                    return Err(CoreError::Malformed { what: "peer link speed", reason: format!("{v} GB/s") })
                }
            },
        })
    }

    /// `host:pid`, for messages.
    pub fn place(&self) -> String {
        format!("{}:{}", self.hostname, self.pid)
    }
}

pub(crate) fn encode_class(w: &mut Writer, c: ConnClass) {
    match c {
        ConnClass::Ring(ChannelId(ch)) => w.u8(0).u16(ch),
        ConnClass::Direct => w.u8(1).u16(0),
        ConnClass::P2p => w.u8(2).u16(0),
        ConnClass::Tree(t) => w.u8(3).u16(t as u16),
        ConnClass::Rma => w.u8(4).u16(0),
    };
}

pub(crate) fn decode_class(r: &mut Reader<'_>) -> Result<ConnClass, CoreError> {
    let k = r.u8()?;
    let ch = r.u16()?;
    match k {
        0 => Ok(ConnClass::Ring(ChannelId(ch))),
        1 => Ok(ConnClass::Direct),
        2 => Ok(ConnClass::P2p),
        3 if (ch as usize) < 2 * oxccl_core::plan::tree::MAX_TREE_CHANNELS => Ok(ConnClass::Tree(ch as u8)),
        4 => Ok(ConnClass::Rma),
        _ => Err(CoreError::Malformed { what: "connection class", reason: format!("kind {k}") }),
    }
}

/// The join request a rank sends the root.
pub(crate) struct Join {
    pub version: u32,
    pub secret: [u8; 32],
    pub rank: u32,
    pub nranks: u32,
    /// The joining rank's `OXCCL_BOOTSTRAP_SPARSE_FROM` (rank 0's decides).
    pub sparse_from: u32,
    /// Which of the communicator's roots this is, and the others' ([`super::roots`]).
    pub place: super::roots::Place,
    pub info: PeerInfo,
}

impl Join {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(JOIN_MAGIC).u32(self.version).raw(&self.secret).u32(self.rank).u32(self.nranks);
        w.u32(self.sparse_from);
        self.place.encode(&mut w);
        self.info.encode(&mut w);
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Join, CoreError> {
        let mut r = Reader::new(b, "join request");
        if r.u32()? != JOIN_MAGIC {
            return Err(CoreError::Malformed { what: "join request", reason: "bad magic".into() });
        }
        let j = Join {
            version: r.u32()?,
            secret: r.fixed()?,
            rank: r.u32()?,
            nranks: r.u32()?,
            sparse_from: r.u32()?,
            place: super::roots::Place::decode(&mut r)?,
            info: PeerInfo::decode(&mut r)?,
        };
        r.finish()?;
        Ok(j)
    }
}

pub(crate) fn encode_reject(reason: &RejectReason) -> Vec<u8> {
    let mut w = Writer::new();
    match reason {
        RejectReason::WrongSecret => w.u8(0),
        RejectReason::WorldSizeMismatch { rank, size, root_size } => {
            w.u8(1).u32(*rank).u32(*size).u32(*root_size)
        }
        RejectReason::DuplicateRank { rank, first, second } => w.u8(2).u32(*rank).str(first).str(second),
        RejectReason::RankOutOfRange { rank, size } => w.u8(3).u32(*rank).u32(*size),
        RejectReason::Version { ours, theirs } => w.u8(4).u32(*ours).u32(*theirs),
        RejectReason::RootOutOfDescriptors { joined, limit } => w.u8(5).u32(*joined).u64(*limit),
        RejectReason::RootRankFailed { rank, reason } => w.u8(6).u32(*rank).str(reason),
        RejectReason::WrongRoot { rank, root, its_root, nroots } => {
            w.u8(7).u32(*rank).u32(*root).u32(*its_root).u32(*nroots)
        }
        RejectReason::MixedIds { index, by, theirs, ours } => {
            w.u8(8).u32(*index).str(by).str(theirs).str(ours)
        }
        RejectReason::RootFailed { root, addr, why } => w.u8(9).u32(*root).str(addr).str(why),
    };
    w.finish()
}

pub(crate) fn decode_reject(b: &[u8]) -> Result<RejectReason, CoreError> {
    let mut r = Reader::new(b, "rejection");
    Ok(match r.u8()? {
        0 => RejectReason::WrongSecret,
        1 => RejectReason::WorldSizeMismatch { rank: r.u32()?, size: r.u32()?, root_size: r.u32()? },
        2 => RejectReason::DuplicateRank {
            rank: r.u32()?,
            first: r.str()?.to_string(),
            second: r.str()?.to_string(),
        },
        3 => RejectReason::RankOutOfRange { rank: r.u32()?, size: r.u32()? },
        4 => RejectReason::Version { ours: r.u32()?, theirs: r.u32()? },
        5 => RejectReason::RootOutOfDescriptors { joined: r.u32()?, limit: r.u64()? },
        6 => RejectReason::RootRankFailed { rank: r.u32()?, reason: r.str()?.to_string() },
        7 => RejectReason::WrongRoot { rank: r.u32()?, root: r.u32()?, its_root: r.u32()?, nroots: r.u32()? },
        8 => RejectReason::MixedIds {
            index: r.u32()?,
            by: r.str()?.to_string(),
            theirs: r.str()?.to_string(),
            ours: r.str()?.to_string(),
        },
        9 => {
            RejectReason::RootFailed { root: r.u32()?, addr: r.str()?.to_string(), why: r.str()?.to_string() }
        }
        k => return Err(CoreError::Malformed { what: "rejection", reason: format!("code {k}") }),
    })
}

pub(crate) fn encode_table(t: &[PeerInfo]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(t.len() as u32);
    for p in t {
        p.encode(&mut w);
    }
    w.finish()
}

/// The peer table's codec on a synthetic table of `n` entries (IPv4 addresses, 9-character
/// host names, 8 ranks a host): bytes per entry and µs to decode one, best of 3. For the
/// bootstrap model (`oxccl sim --bootstrap`).
pub fn table_codec_probe(n: usize) -> (f64, f64) {
    let n = n.max(1);
    let table: Vec<PeerInfo> = (0..n as u32)
        .map(|r| PeerInfo {
            rank: Rank(r),
            pid: 1000 + r,
            host_id: u64::from(r / 8),
            hostname: format!("node{:05}", r / 8),
            addr: SocketAddr::from(([10, (r >> 16) as u8, (r >> 8) as u8, r as u8], 40000)),
            unix_name: [1; 16],
            costs: Default::default(),
            cuda_device: -1,
            rails: Vec::new(),
            machine: 0,
            nic_gbs: 1.25,
        })
        .collect();
    let bytes = encode_table(&table);
    let best = (0..3)
        .map(|_| {
            let t = Instant::now();
            let back = decode_table(&bytes).map(|v| v.len()).unwrap_or(0);
            debug_assert_eq!(back, n);
            t.elapsed()
        })
        .min()
        .unwrap_or_default();
    (bytes.len() as f64 / n as f64, best.as_secs_f64() * 1e6 / n as f64)
}

pub(crate) fn decode_table(b: &[u8]) -> Result<Vec<PeerInfo>, CoreError> {
    let mut r = Reader::new(b, "peer table");
    let n = r.u32()? as usize;
    // Each entry takes at least 40 bytes: refuse counts the message cannot hold.
    if n > b.len() / 40 + 1 {
        return Err(CoreError::Malformed {
            what: "peer table",
            reason: format!("claims {n} entries in {} bytes", b.len()),
        });
    }
    let t = (0..n).map(|_| PeerInfo::decode(&mut r)).collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    Ok(t)
}

/// How the peer table reaches a rank, as the root tells each rank once all have joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// Rank 0's `OXCCL_BOOTSTRAP_SPARSE_FROM`, which holds for the communicator (0: never).
    pub sparse_from: u32,
    /// Sparse: the table comes down the relay tree, from this rank's parent there (rank 0
    /// gets it from the root), and lifelines go to neighbours only.
    pub sparse: bool,
    /// Sparse, below rank 0: the services of the rank's ancestors in the relay tree, parent
    /// first (at most 32), so a rank whose parent's process ended before it relayed finds
    /// out (a refused connection) and knows whether an ancestor still lives to relay past it.
    pub ancestors: Vec<SocketAddr>,
    /// Sparse: the services of the rank's children in the relay tree (at most 2), so it
    /// forwards the table before decoding it: decoding (0.3 µs an entry) stays off the
    /// path the table travels down.
    pub children: Vec<SocketAddr>,
}

impl Route {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.sparse_from).u8(self.sparse as u8).u8(self.ancestors.len() as u8);
        for a in &self.ancestors {
            put_addr(&mut w, a);
        }
        w.u8(self.children.len() as u8);
        for a in &self.children {
            put_addr(&mut w, a);
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Route, CoreError> {
        let mut r = Reader::new(b, "route");
        let sparse_from = r.u32()?;
        let sparse = match r.u8()? {
            0 => false,
            1 => true,
            k => return Err(CoreError::Malformed { what: "route", reason: format!("mode {k}") }),
        };
        let n = r.u8()? as usize;
        if n > 32 {
            return Err(CoreError::Malformed { what: "route", reason: format!("{n} ancestors") });
        }
        let ancestors = (0..n).map(|_| get_addr(&mut r)).collect::<Result<Vec<_>, _>>()?;
        let n = r.u8()? as usize;
        if n > 2 {
            return Err(CoreError::Malformed { what: "route", reason: format!("{n} children") });
        }
        let children = (0..n).map(|_| get_addr(&mut r)).collect::<Result<Vec<_>, _>>()?;
        r.finish()?;
        Ok(Route { sparse_from, sparse, ancestors, children })
    }

    /// The ranks above `me` in the relay tree, parent first.
    pub fn ancestors_of(me: Rank) -> Vec<Rank> {
        let mut v = Vec::new();
        let mut r = me.idx();
        while r > 0 {
            r = (r - 1) / 2;
            v.push(Rank::new(r));
        }
        v
    }

    /// Whether a communicator of `size` ranks is sparse under the threshold `sparse_from`.
    pub fn is_sparse(size: usize, sparse_from: usize) -> bool {
        sparse_from != 0 && size >= sparse_from.max(2)
    }
}

/// The root's word on an incomplete rendezvous: the ranks of its share that have not joined,
/// and the other roots it waits for (root 0: those that have not reported; root `k > 0`: root
/// 0, once its share is in), at most [`JoinStatus::MAX_LISTED`] of each, lowest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JoinStatus {
    pub missing: Vec<Rank>,
    pub roots: Vec<u32>,
}

impl JoinStatus {
    pub const MAX_LISTED: usize = 64;

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        let listed = &self.missing[..self.missing.len().min(Self::MAX_LISTED)];
        w.u32(listed.len() as u32);
        for r in listed {
            w.u32(r.0);
        }
        let roots = &self.roots[..self.roots.len().min(Self::MAX_LISTED)];
        w.u32(roots.len() as u32);
        for k in roots {
            w.u32(*k);
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<JoinStatus, CoreError> {
        let mut r = Reader::new(b, "join status");
        let n = r.u32()? as usize;
        if n > Self::MAX_LISTED {
            return Err(CoreError::Malformed { what: "join status", reason: format!("{n} ranks listed") });
        }
        let missing = (0..n).map(|_| r.u32().map(Rank)).collect::<Result<Vec<_>, _>>()?;
        let n = r.u32()? as usize;
        if n > Self::MAX_LISTED {
            return Err(CoreError::Malformed { what: "join status", reason: format!("{n} roots listed") });
        }
        let roots = (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        r.finish()?;
        Ok(JoinStatus { missing, roots })
    }
}

/// The hello that opens every connection to a rank's service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub secret: [u8; 32],
    pub from: Rank,
    pub to: Rank,
    /// `None`: a control-message connection; `Some`: a data connection of that class.
    pub data: Option<ConnClass>,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(HELLO_MAGIC).u32(PROTOCOL_VERSION).raw(&self.secret).u32(self.from.0).u32(self.to.0);
        match self.data {
            None => {
                w.u8(0);
            }
            Some(c) => {
                w.u8(1);
                encode_class(&mut w, c);
            }
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Hello, CoreError> {
        let mut r = Reader::new(b, "hello");
        if r.u32()? != HELLO_MAGIC || r.u32()? != PROTOCOL_VERSION {
            return Err(CoreError::Malformed { what: "hello", reason: "bad magic or version".into() });
        }
        let secret = r.fixed()?;
        let from = Rank(r.u32()?);
        let to = Rank(r.u32()?);
        let data = match r.u8()? {
            0 => None,
            1 => Some(decode_class(&mut r)?),
            k => return Err(CoreError::Malformed { what: "hello", reason: format!("connection kind {k}") }),
        };
        r.finish()?;
        Ok(Hello { secret, from, to, data })
    }
}
