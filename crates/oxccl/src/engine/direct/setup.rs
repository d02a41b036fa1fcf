//! Setting up the direct path: control blocks exchanged with every same-host peer and mapped,
//! and the cross-memory probe of each peer.

use super::*;

impl Direct {
    /// Exchanges control blocks with every peer (the lower rank of each pair asks, the higher
    /// one waits for the offer) and maps theirs.
    pub fn setup(
        id: Identity<'_>,
        own: Arc<Ctl>,
        doorbell: Arc<EventFd>,
        mailbox: &Mailbox,
        abort: Arc<AtomicBool>,
        w: &Waiter,
    ) -> Result<Direct> {
        let Identity { me, peers, secret, cma: cma_mode } = id;
        let p = peers.len();
        let m = me.idx();
        let mut out: Vec<Option<PeerCtl>> = (0..p).map(|_| None).collect();
        let io = |q: usize| move |e| Error::io(me, "direct path setup", Some(Rank::new(q)), e);
        for q in m + 1..p {
            let ctl_fd = own.try_clone_fd().map_err(io(q))?;
            let req = HostRequest::Arena { secret, from: me, to: Rank::new(q) };
            let mut fds = host_call(&peers[q].unix_name, &req, &[ctl_fd.as_raw_fd(), doorbell.as_raw_fd()])
                .map_err(io(q))?;
            let (Some(bell), Some(ctl)) = (fds.pop(), fds.pop()) else {
                return Err(Error::Internal(format!(
                    "rank {q} answered the control-block exchange without descriptors"
                )));
            };
            out[q] = Some(PeerCtl { ctl: Ctl::open(ctl).map_err(io(q))?, bell: EventFd::from_owned(bell) });
        }
        for (q, slot) in out.iter_mut().enumerate().take(m) {
            let (ctl, bell) = mailbox.wait_arena(Rank::new(q), w)?;
            *slot = Some(PeerCtl { ctl: Ctl::open(ctl).map_err(io(q))?, bell: EventFd::from_owned(bell) });
        }
        let cma = if cma_mode != CrossMemory::Off {
            cma::probe_peers(m, peers, &out)
        } else {
            Err("OXCCL_CMA=0".to_string())
        };
        let cpus = crate::sys::affinity::host_cpus();
        let oversubscribed = p > cpus;
        let spin =
            Duration::from_nanos(if oversubscribed { DIRECT_SPIN_OVERSUBSCRIBED_NS } else { DIRECT_SPIN_NS });
        Ok(Direct {
            me: m,
            p,
            secret,
            unix: peers.iter().map(|i| i.unix_name).collect(),
            own,
            peers: out,
            seq: 0,
            allocs: HashMap::new(),
            doorbell,
            abort,
            spin,
            host: Host {
                nranks: p,
                oversubscribed,
                l2_bytes: crate::sys::host::l2_cache_bytes().unwrap_or(Host::L2_UNKNOWN),
            },
            block: vec![0u64; DIRECT_BLOCK_BYTES / 8],
            cma,
            cma_mode,
            cma_tmp: Vec::new(),
        })
    }
}
