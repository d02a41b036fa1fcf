//! One-sided calls on host memory (NCCL 2.29+'s `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`): windows that every rank registers collectively, puts that land in a
//! peer's window without the peer making a call, and signals counted per (origin, context,
//! index) that waits consume.
//!
//! Transports, per (origin, target) and window, chosen when the window is registered:
//! - the origin itself, or a rank that is a thread of the origin's process: the origin writes
//!   the target's window directly;
//! - a rank of the same host (shared memory on) whose window lies in a shared allocation
//!   (`SharedBuf`, which `ncclMemAlloc` returns): the origin maps the allocation once and
//!   writes into it: zero copy;
//! - anything else (another host, `NCCL_SHM_DISABLE=1`, heap memory of another process): a
//!   TCP stream to the target, whose RMA thread writes the data (`stream`).
//!
//! A signal is counted in the target's signal block (`block`): in place by the origin when
//! it mapped the block (same host) and its stream to the target has drained, else as a frame
//! on the stream, behind the data. Device memory is never written: a put into a window some
//! rank registered on device memory is refused (`InvalidUsage`), as are puts when no path
//! serves them.
//!
//! Rules:
//! 1. Registration and deregistration are collective: every rank makes them in the same
//!    order; the k-th registration on every rank forms window #k (`Window::index`).
//! 2. Per (origin, target), puts and signals take effect in program order (data and signals):
//!    a put or signal goes zero-copy only when the stream to that target has drained
//!    (`applied[origin]` in the target's block equals what the origin sent), otherwise on the
//!    stream; a pair's calls are made under the pair's lock.
//! 3. A put is checked against the target's size of the window, which every rank learns at
//!    registration.
//! 4. A wait consumes what it waited for: each (peer, ctx, sigIdx) has a count this rank's
//!    waits consumed, and a wait for n more completes when n more than that have arrived (as
//!    NCCL raises its expected signal value by n at each wait).
//! 5. A window is written by peers only while registered: a peer's direct writes happen under
//!    its read lock of its view of the window, and deregistration takes that lock for writing
//!    before the collective barrier; the RMA thread re-checks the window for each piece.

mod api;
mod block;
mod stream;

pub use api::{WaitDesc, Window};

use crate::comm::Inner;
use crate::error::{Error, Result};
use crate::mem::PeerAlloc;
use crate::sys::fd::EventFd;
use crate::transport::host::{host_call, HostRequest};
use crate::wait::Waiter;
use block::Block;
use oxccl_core::wire::{Reader, Writer};
use oxccl_core::{CoreError, Rank};
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// Contexts (`ctx`) a signal may name: NCCL's `numRmaCtx` beyond this is refused by the calls.
pub const CONTEXTS: usize = 4;
/// Signal indices (`sigIdx`) per context.
pub const SIGNALS: usize = 8;

const TAG_REGISTER: u64 = 0xD0 << 56;
const TAG_DEREGISTER: u64 = 0xD1 << 56;
/// How long a wait spins (yielding) before it sleeps.
const SPIN: Duration = Duration::from_micros(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A window this rank registered: where its instance is (the RMA thread writes there).
pub(crate) struct LocalWin {
    pub base: usize,
    pub len: usize,
    pub device: bool,
}

/// How this rank reaches one rank's instance of a window.
enum Reach {
    /// The address, in this process.
    Direct(usize),
    /// A peer's shared allocation mapped here, and the window's offset in it.
    Mapped(PeerAlloc, usize),
    Stream,
    Device,
}

/// One rank's instance of a window, as this rank sees it.
struct Remote {
    len: usize,
    reach: Reach,
}

/// What an origin keeps per target.
#[derive(Default)]
struct Link {
    /// The target's signal block, mapped (same host), or this rank's own.
    block: Option<Arc<Block>>,
    stream: Option<TcpStream>,
    /// Frames sent on `stream`.
    sent: u64,
}

/// A communicator's one-sided state (made at its first one-sided call or registration).
pub(crate) struct Rma {
    id: u64,
    me: Rank,
    block: Arc<Block>,
    local: Arc<Mutex<HashMap<u64, LocalWin>>>,
    views: RwLock<HashMap<u64, Vec<Remote>>>,
    links: Vec<Mutex<Link>>,
    consumed: Mutex<HashMap<(u32, usize, usize), u64>>,
    next_seq: AtomicU64,
    dropped: Arc<Mutex<Option<String>>>,
    stop: Arc<EventFd>,
    stopped: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Puts and signals this rank made in place to other ranks, and frames it sent on streams
    /// (logged at the end, so tests and users can see which path served them).
    in_place: AtomicU64,
    streamed: AtomicU64,
    log: crate::log::Logger,
}

/// A number unique to this process (ranks that are threads of one process share it).
fn process_token() -> u64 {
    static T: OnceLock<u64> = OnceLock::new();
    *T.get_or_init(|| {
        let mut b = [0u8; 8];
        if getrandom::getrandom(&mut b).is_err() {
            b = (std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15).to_le_bytes();
        }
        u64::from_le_bytes(b) | 1
    })
}

fn invalid(arg: &'static str, reason: impl Into<String>) -> Error {
    CoreError::InvalidArgument { arg, reason: reason.into() }.into()
}

/// What each rank tells the others when it registers a window.
struct Offer {
    seq: u64,
    base: u64,
    len: u64,
    device: bool,
    /// The shared allocation holding the window, and the window's offset in it.
    shared: Option<(u64, u64)>,
    token: u64,
    block: u64,
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        let (alloc, off) = self.shared.unwrap_or((0, 0));
        w.u64(self.seq).u64(self.base).u64(self.len).u8(self.device as u8).u8(self.shared.is_some() as u8);
        w.u64(alloc).u64(off).u64(self.token).u64(self.block);
        w.finish()
    }

    fn decode(b: &[u8]) -> Result<Offer> {
        let mut r = Reader::new(b, "window registration");
        let (seq, base, len, device, shared) = (r.u64()?, r.u64()?, r.u64()?, r.u8()? != 0, r.u8()? != 0);
        let (alloc, off, token, block) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        r.finish()?;
        Ok(Offer { seq, base, len, device, shared: shared.then_some((alloc, off)), token, block })
    }
}

impl crate::comm::Attached for Rma {
    fn stop(&self) {
        Rma::stop(self)
    }

    fn wake(&self) {
        Rma::wake(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Rma {
    /// The communicator's one-sided state, made (with its thread) at the first use.
    pub(crate) fn of(inner: &Inner) -> Result<&Rma> {
        if Rma::get(inner).is_none() {
            let r: Box<dyn crate::comm::Attached> = Box::new(Rma::new(inner)?);
            if inner.one_sided.set(r).is_ok() {
                Rma::get(inner).expect("just set").start(inner)?;
            }
        }
        Ok(Rma::get(inner).expect("set above"))
    }

    /// The communicator's one-sided state, if made.
    pub(crate) fn get(inner: &Inner) -> Option<&Rma> {
        inner.one_sided.get().and_then(|a| a.as_any().downcast_ref::<Rma>())
    }

    fn new(inner: &Inner) -> Result<Rma> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let me = inner.rank;
        let block = Arc::new(Block::create(inner.size)?);
        let links: Vec<Mutex<Link>> = (0..inner.size).map(|_| Mutex::new(Link::default())).collect();
        lock(&links[me.idx()]).block = Some(block.clone());
        Ok(Rma {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            me,
            block,
            local: Arc::new(Mutex::new(HashMap::new())),
            views: RwLock::new(HashMap::new()),
            links,
            consumed: Mutex::new(HashMap::new()),
            next_seq: AtomicU64::new(0),
            dropped: Arc::new(Mutex::new(None)),
            stop: Arc::new(EventFd::new().map_err(|e| Error::io(me, "eventfd", None, e))?),
            stopped: AtomicBool::new(false),
            thread: Mutex::new(None),
            in_place: AtomicU64::new(0),
            streamed: AtomicU64::new(0),
            log: inner.log,
        })
    }

    /// Starts the thread that applies peers' streams (once).
    fn start(&self, inner: &Inner) -> Result<()> {
        let bell = Arc::new(EventFd::new().map_err(|e| Error::io(self.me, "eventfd", None, e))?);
        inner.mailbox.on_rma_conn(bell.clone());
        let sv = stream::Served {
            me: self.me,
            block: self.block.clone(),
            local: self.local.clone(),
            dropped: self.dropped.clone(),
            mailbox: inner.mailbox.clone(),
            log: inner.log,
            stop: self.stop.clone(),
            bell,
        };
        let t = stream::spawn(sv).map_err(|e| Error::io(self.me, "spawn the one-sided thread", None, e))?;
        *lock(&self.thread) = Some(t);
        Ok(())
    }

    /// Stops the thread and closes this rank's streams (the communicator is being closed).
    pub(crate) fn stop(&self) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            self.log.info(format_args!(
                "one-sided: this rank made {} puts and signals to other ranks in place and sent {} by stream",
                self.in_place.load(Ordering::Relaxed),
                self.streamed.load(Ordering::Relaxed)
            ));
        }
        self.stop.notify();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        for l in &self.links {
            lock(l).stream.take();
        }
        self.block.wake();
    }

    /// Wakes this rank's waits (an abort: they see the flag).
    pub(crate) fn wake(&self) {
        self.block.wake();
    }

    /// A waiter for one-sided calls: the communicator's timeout and abort, gone peers, and a
    /// line on stderr every `OXCCL_WAIT_NOTICE` while it waits (no probes: a peer's place in
    /// its collectives says nothing of the signals it owes).
    fn waiter(&self, inner: &Inner) -> Waiter {
        Waiter::new(self.me, inner.config.timeout, inner.abort.clone())
            .watching(&inner.mailbox)
            .announcing(inner.config.wait_notice)
    }

    /// A failure that leaves the communicator's connections unknown fails it (as calls do).
    fn fatal(inner: &Inner, e: Error) -> Error {
        let e = if inner.abort.load(Ordering::Relaxed) { Error::Aborted { rank: inner.rank } } else { e };
        let e = inner.mailbox.explain(e, Duration::from_millis(200));
        if e.is_fatal() {
            inner.fail(&e);
        }
        e
    }

    /// Maps `peer`'s shared allocation `alloc` through its service.
    fn map(inner: &Inner, peer: Rank, alloc: u64) -> std::io::Result<PeerAlloc> {
        let req = HostRequest::Map { secret: inner.secret, from: inner.rank, to: peer, alloc };
        let fd = host_call(&inner.peers[peer.idx()].unix_name, &req, &[])?
            .pop()
            .ok_or_else(|| std::io::Error::other("shared allocation answer without a descriptor"))?;
        PeerAlloc::map(fd, alloc)
    }

    /// Registers `[base, base + len)` as this rank's instance of the next window (rule 1).
    pub(crate) fn register(&self, inner: &Inner, base: usize, len: usize, device: bool) -> Result<Window> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        lock(&self.local).insert(seq, LocalWin { base, len, device });
        let offer = Offer {
            seq,
            base: base as u64,
            len: len as u64,
            device,
            shared: if device { None } else { crate::mem::lookup(base as *const u8, len) }
                .map(|(a, o)| (a, o as u64)),
            token: process_token(),
            block: self.block.alloc_id(),
        };
        let w = self.waiter(inner);
        let all = match inner.boot.all_gather(TAG_REGISTER | seq, &offer.encode(), &w) {
            Ok(a) => a,
            Err(e) => {
                lock(&self.local).remove(&seq);
                return Err(Self::fatal(inner, e));
            }
        };
        let view = self.views_of(inner, seq, &all).inspect_err(|_| {
            lock(&self.local).remove(&seq);
        })?;
        if inner.log.on(oxccl_core::config::subsys::INIT) {
            let how: Vec<String> = view
                .iter()
                .enumerate()
                .map(|(q, r)| {
                    let how = match r.reach {
                        Reach::Direct(_) => "direct",
                        Reach::Mapped(..) => "mapped",
                        Reach::Stream => "stream",
                        Reach::Device => "device",
                    };
                    format!("{q}:{how}")
                })
                .collect();
            inner.log.info(format_args!(
                "one-sided: window #{seq} registered ({len} bytes at {base:#x}{}); puts to ranks {}",
                if device { ", device memory: one-sided calls refused" } else { "" },
                how.join(" ")
            ));
        }
        self.views.write().unwrap_or_else(|e| e.into_inner()).insert(seq, view);
        Ok(Window { rma: self.id, seq, base, len })
    }

    /// How this rank reaches every rank's instance of window `seq`, from their offers
    /// (mapping what it can: peers' shared allocations and signal blocks on this host).
    fn views_of(&self, inner: &Inner, seq: u64, all: &[Vec<u8>]) -> Result<Vec<Remote>> {
        let me = self.me;
        let shm = !inner.config.shm_disable;
        let mut view = Vec::with_capacity(all.len());
        for (q, bytes) in all.iter().enumerate() {
            let peer = Rank::new(q);
            let o = Offer::decode(bytes)?;
            if o.seq != seq {
                return Err(Error::Internal(format!(
                    "rank {me}: rank {peer}'s window registration is #{} where this rank's is #{seq}",
                    o.seq
                )));
            }
            let same_host = shm && inner.peers[q].host_id == inner.peers[me.idx()].host_id;
            if same_host && peer != me && o.block != 0 {
                let mut link = lock(&self.links[q]);
                if link.block.is_none() {
                    match Self::map(inner, peer, o.block).and_then(|a| {
                        Block::map(a, inner.size, me, peer).map_err(|e| std::io::Error::other(e.to_string()))
                    }) {
                        Ok(b) => link.block = Some(Arc::new(b)),
                        Err(e) => inner.log.warn(format_args!(
                            "one-sided: cannot map rank {peer}'s signal block ({e}): its signals go by stream"
                        )),
                    }
                }
            }
            let reach = if o.device {
                Reach::Device
            } else if peer == me || (same_host && o.token == process_token()) {
                Reach::Direct(o.base as usize)
            } else if let (true, Some((alloc, off))) = (same_host, o.shared) {
                match Self::map(inner, peer, alloc) {
                    Ok(a) if a.range(off as usize, o.len as usize).is_some() => {
                        Reach::Mapped(a, off as usize)
                    }
                    Ok(_) => Reach::Stream,
                    Err(e) => {
                        inner.log.warn(format_args!(
                            "one-sided: cannot map rank {peer}'s window #{seq} ({e}): puts to it go by stream"
                        ));
                        Reach::Stream
                    }
                }
            } else {
                Reach::Stream
            };
            view.push(Remote { len: o.len as usize, reach });
        }
        Ok(view)
    }

    fn check_window(&self, win: &Window, arg: &'static str) -> Result<()> {
        if win.rma != self.id {
            return Err(invalid(arg, format!("window #{} belongs to another communicator", win.seq)));
        }
        Ok(())
    }

    /// Deregisters `win` (collective, rule 5); local resources go even if the barrier fails.
    pub(crate) fn deregister(&self, inner: &Inner, win: &Window) -> Result<()> {
        self.check_window(win, "win")?;
        let gone = self.views.write().unwrap_or_else(|e| e.into_inner()).remove(&win.seq);
        if gone.is_none() {
            return Err(invalid(
                "win",
                format!("window #{} is not registered (deregistered already?)", win.seq),
            ));
        }
        drop(gone);
        let r = inner.check_usable().and_then(|()| {
            let w = self.waiter(inner);
            inner.boot.all_gather(TAG_DEREGISTER | win.seq, &[], &w).map_err(|e| Self::fatal(inner, e))
        });
        lock(&self.local).remove(&win.seq);
        r.map(|_| ())
    }

    fn check_signal(ctx: usize, sig: usize) -> Result<()> {
        if ctx >= CONTEXTS {
            return Err(invalid("ctx", format!("{ctx}: oxccl serves contexts 0..{}", CONTEXTS - 1)));
        }
        if sig >= SIGNALS {
            return Err(invalid("sigIdx", format!("{sig}: oxccl serves signal indices 0..{}", SIGNALS - 1)));
        }
        Ok(())
    }

    /// The size of `peer`'s instance of `win`.
    pub(crate) fn peer_len(&self, win: &Window, peer: Rank) -> Result<usize> {
        self.check_window(win, "peerWin")?;
        let views = self.views.read().unwrap_or_else(|e| e.into_inner());
        views.get(&win.seq).map(|v| v[peer.idx()].len).ok_or_else(|| {
            invalid("peerWin", format!("window #{} is not registered (deregistered?)", win.seq))
        })
    }

    /// Whether `link`'s stream has drained (rule 2): `Some(block)` to count in place.
    fn drained<'a>(&self, link: &'a Link) -> Option<&'a Arc<Block>> {
        link.block.as_ref().filter(|b| b.applied(self.me).load(Ordering::Acquire) == link.sent)
    }

    /// The error for a call that needs `peer`, which destroyed its communicator in order.
    fn left(inner: &Inner, peer: Rank, what: &str) -> Error {
        Error::PeerClosed {
            rank: inner.rank,
            op: format!("{what}: rank {peer} destroyed its communicator in order (did every rank make the same calls?)"),
            peer,
            host: inner.mailbox.host_of(peer),
        }
    }

    /// Sends a frame on `link`'s stream (opened at its first use).
    fn send(
        &self,
        inner: &Inner,
        peer: Rank,
        link: &mut Link,
        h: &stream::Header,
        data: &[u8],
    ) -> Result<()> {
        if inner.mailbox.has_left(peer) {
            return Err(Self::fatal(inner, Self::left(inner, peer, "one-sided call")));
        }
        let w = self.waiter(inner);
        let r = (|| {
            if link.stream.is_none() {
                link.stream = Some(stream::connect(self.me, &inner.peers[peer.idx()], inner.secret, &w)?);
            }
            stream::send(link.stream.as_ref().expect("opened above"), h, data, &w, peer)
        })();
        match r {
            Ok(()) => {
                link.sent += 1;
                self.streamed.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // A frame may be half written: the stream cannot carry another.
                link.stream = None;
                Err(Self::fatal(inner, e))
            }
        }
    }

    /// Writes `data` at `offset` of `peer`'s instance of `win`, then one signal (ctx, sig).
    pub(crate) fn put(
        &self,
        inner: &Inner,
        data: &[u8],
        peer: Rank,
        win: &Window,
        offset: usize,
        (ctx, sig): (usize, usize),
    ) -> Result<()> {
        self.check_window(win, "peerWin")?;
        Self::check_signal(ctx, sig)?;
        let views = self.views.read().unwrap_or_else(|e| e.into_inner());
        let Some(view) = views.get(&win.seq) else {
            return Err(invalid("peerWin", format!("window #{} is not registered (deregistered?)", win.seq)));
        };
        let r = &view[peer.idx()];
        if offset.checked_add(data.len()).is_none_or(|end| end > r.len) {
            return Err(invalid(
                "peerWinOffset",
                format!(
                    "{offset} + {} bytes runs past rank {peer}'s window #{}, which holds {} bytes",
                    data.len(),
                    win.seq,
                    r.len
                ),
            ));
        }
        if let Reach::Device = r.reach {
            return Err(Error::InvalidUsage(format!(
                "rank {}: rank {peer} registered window #{} on device memory: oxccl's one-sided calls serve host memory only (no engine writes a peer's device memory)",
                self.me, win.seq
            )));
        }
        let mut link = lock(&self.links[peer.idx()]);
        let dst = match &r.reach {
            Reach::Direct(base) => Some((base + offset) as *mut u8),
            Reach::Mapped(a, off) => a.range(off + offset, data.len()),
            Reach::Stream | Reach::Device => None,
        };
        if let (Some(b), Some(dst)) = (self.drained(&link), dst) {
            if !data.is_empty() {
                // SAFETY: `dst` addresses `data.len()` bytes of the target's registered window
                // (checked against its size above; a mapping's range is checked again by
                // `range`), which stays registered while this rank holds its read lock of the
                // view (rule 5); `copy` allows the overlap of a put to this rank's own window.
                unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
            }
            b.count(self.me, ctx, sig);
            self.in_place.fetch_add((peer != self.me) as u64, Ordering::Relaxed);
            return Ok(());
        }
        let h = stream::Header {
            kind: stream::PUT,
            ctx: ctx as u8,
            sig: sig as u8,
            win: win.seq,
            off: offset as u64,
            len: data.len() as u64,
        };
        self.send(inner, peer, &mut link, &h, data)
    }

    /// One signal (ctx, sig) to `peer`, after every earlier put and signal to it.
    pub(crate) fn signal(&self, inner: &Inner, peer: Rank, ctx: usize, sig: usize) -> Result<()> {
        Self::check_signal(ctx, sig)?;
        let mut link = lock(&self.links[peer.idx()]);
        if let Some(b) = self.drained(&link) {
            b.count(self.me, ctx, sig);
            self.in_place.fetch_add((peer != self.me) as u64, Ordering::Relaxed);
            return Ok(());
        }
        let h =
            stream::Header { kind: stream::SIGNAL, ctx: ctx as u8, sig: sig as u8, win: 0, off: 0, len: 0 };
        self.send(inner, peer, &mut link, &h, &[])
    }

    /// Waits until every descriptor's signals have arrived beyond what earlier waits consumed,
    /// then consumes them (rule 4).
    pub(crate) fn wait(&self, inner: &Inner, descs: &[WaitDesc]) -> Result<()> {
        for d in descs {
            Self::check_signal(d.ctx, d.sig)?;
        }
        let mut consumed = lock(&self.consumed);
        let mut want: Vec<((u32, usize, usize), u64)> = Vec::new();
        for d in descs {
            let k = (d.peer.0, d.ctx, d.sig);
            match want.iter_mut().find(|(x, _)| *x == k) {
                Some((_, n)) => *n += d.count,
                None => want.push((k, consumed.get(&k).copied().unwrap_or(0) + d.count)),
            }
        }
        let arrived =
            |k: &(u32, usize, usize)| self.block.arrived(Rank(k.0), k.1, k.2).load(Ordering::Acquire);
        let ready = || want.iter().all(|(k, n)| arrived(k) >= *n);
        let spin_until = Instant::now() + SPIN;
        while !ready() && Instant::now() < spin_until {
            std::thread::yield_now();
        }
        let w = self.waiter(inner);
        let mut left_seen: Option<Instant> = None;
        while !ready() {
            if let Some(why) = lock(&self.dropped).take() {
                return Err(Error::InvalidUsage(format!("rank {}: one-sided wait: {why}", self.me)));
            }
            let pending: Vec<&((u32, usize, usize), u64)> =
                want.iter().filter(|(k, n)| arrived(k) < *n).collect();
            let what = pending
                .iter()
                .take(4)
                .map(|((p, c, s), n)| {
                    let before = consumed.get(&(*p, *c, *s)).copied().unwrap_or(0);
                    let got = arrived(&(*p, *c, *s)).saturating_sub(before);
                    format!("{} signal(s) from rank {p} on sigIdx {s} ctx {c} ({got} arrived)", n - before)
                })
                .collect::<Vec<_>>()
                .join(", ");
            let peers: Vec<Rank> = pending.iter().map(|((p, _, _), _)| Rank(*p)).collect();
            // A peer that destroyed its communicator in order may still have frames on their
            // way (its stream is not its control connection): a grace, then the wait fails.
            if let Some(&p) = peers.iter().find(|p| inner.mailbox.has_left(**p)) {
                let seen = *left_seen.get_or_insert_with(Instant::now);
                if seen.elapsed() >= Duration::from_millis(crate::wait::LEFT_GRACE_MS) {
                    let what = format!("one-sided wait (ncclWaitSignal) for {what}");
                    return Err(Self::fatal(inner, Self::left(inner, p, &what)));
                }
            }
            if let Err(e) = w.check(&format!("one-sided wait (ncclWaitSignal) for {what}"), &peers) {
                return Err(Self::fatal(inner, e));
            }
            if self.stopped.load(Ordering::Relaxed) {
                return Err(Error::InvalidUsage(format!("rank {}: the communicator was destroyed", self.me)));
            }
            self.block.sleep_unless(w.slice().max(Duration::from_millis(1)), ready);
        }
        for (k, n) in want {
            consumed.insert(k, n);
        }
        Ok(())
    }
}
