//! Windows and the one-sided work on them: the process's table of windows (a handle maps to
//! its communicator, base and registration state: [`lookup`], [`forget`]), the checked
//! operations ([`Op`]: window registrations, puts, signals, waits) and how they run
//! ([`submit`]: at once outside a group, else in the communicator's batch of the open group,
//! which `ncclGroupEnd` runs as one job in program order; the rules are [`crate::rma`]'s and
//! [`crate::win`]'s).
//!
//! Rule: below both entry-point modules that share it, [`crate::win`] (windows) and
//! [`crate::rma`] (one-sided calls); it names the handles, registrations ([`crate::mem`]) and
//! the group queue ([`crate::ops`]), never an entry point.

use crate::fail::{invalid, lock, Fail, INTERNAL_ERROR, R};
use crate::handle::{self, CommState, Pin, RegKind, Tomb};
use crate::mem;
use crate::ops;
use oxccl::rma::{WaitDesc, Window};
use oxccl::{Communicator, Rank};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Where a window's registration stands.
pub(crate) enum WinState {
    /// Queued in a group, not run yet.
    Pending,
    Ready(oxccl::rma::Window),
    /// The registration failed, for this reason.
    Failed(String),
    /// Deregistered.
    Gone,
}

/// What a window handle stands for (rule 1).
pub(crate) struct WinRec {
    pub(crate) comm: usize,
    pub(crate) base: usize,
    pub(crate) state: Arc<Mutex<WinState>>,
}

pub(crate) fn table() -> MutexGuard<'static, HashMap<usize, WinRec>> {
    static T: OnceLock<Mutex<HashMap<usize, WinRec>>> = OnceLock::new();
    lock(T.get_or_init(Default::default))
}

/// The window `h` of `st` (the argument is named `arg`): its handle and state.
pub(crate) fn lookup(st: &CommState, h: usize, arg: &str) -> R<(usize, Arc<Mutex<WinState>>)> {
    if h == 0 {
        return Err(invalid(arg, "NULL window"));
    }
    match table().get(&h) {
        Some(w) if w.comm == st.handle => Ok((h, w.state.clone())),
        Some(w) => Err(invalid(
            arg,
            format!("{h:#x} is a window of communicator {:#x}, not of this one ({:#x})", w.comm, st.handle),
        )),
        None => Err(invalid(
            arg,
            format!("{h:#x} is not a window registered on this communicator (or it was deregistered)"),
        )),
    }
}

/// Forgets window `h` of `st` (its registration failed).
pub(crate) fn forget(st: &CommState, h: usize) {
    table().remove(&h);
    let _ = mem::deregister(st, RegKind::Window, h, "win");
}

/// A checked one-sided call or window (de)registration, ready to run.
pub(crate) enum Op {
    Register {
        h: usize,
        base: usize,
        len: usize,
        device: bool,
        state: Arc<Mutex<WinState>>,
    },
    Deregister {
        state: Arc<Mutex<WinState>>,
    },
    Put {
        src: usize,
        bytes: usize,
        peer: Rank,
        h: usize,
        state: Arc<Mutex<WinState>>,
        off: usize,
        at: (usize, usize),
    },
    Signal {
        peer: Rank,
        at: (usize, usize),
    },
    Wait {
        descs: Vec<WaitDesc>,
    },
}

// SAFETY: an Op is addresses and sizes; nccl.h makes the caller keep `src` valid and unchanged
// until the call (or its group) has completed, and the window memory registered until it is
// deregistered, on whichever thread runs the op.
unsafe impl Send for Op {}

impl Op {
    fn func(&self) -> &'static str {
        match self {
            Op::Register { .. } => "ncclCommWindowRegister",
            Op::Deregister { .. } => "ncclCommWindowDeregister",
            Op::Put { .. } => "ncclPutSignal",
            Op::Signal { .. } => "ncclSignal",
            Op::Wait { .. } => "ncclWaitSignal",
        }
    }

    fn run(self, st: &CommState, c: &Communicator) -> R<()> {
        match self {
            Op::Register { h, base, len, device, state } => {
                // SAFETY: the caller registers memory it keeps valid until it deregisters the
                // window (nccl.h's contract for ncclCommWindowRegister).
                let r = unsafe { c.register_window(base as *mut u8, len, device) };
                match r {
                    Ok(w) => {
                        *lock(&state) = WinState::Ready(w);
                        Ok(())
                    }
                    Err(e) => {
                        let f = Fail::from(e);
                        *lock(&state) = WinState::Failed(f.msg.clone());
                        forget(st, h);
                        Err(f)
                    }
                }
            }
            Op::Deregister { state } => {
                let w = std::mem::replace(&mut *lock(&state), WinState::Gone);
                match w {
                    WinState::Ready(w) => c.deregister_window(w).map_err(Fail::from),
                    // Its registration failed (and said so): nothing was registered.
                    _ => Ok(()),
                }
            }
            Op::Put { src, bytes, peer, h, state, off, at } => {
                let w = ready_window(&state, h, "peerWin")?;
                let data: &[u8] = if bytes == 0 {
                    &[]
                } else {
                    // SAFETY: checked non-NULL with `bytes` > 0; the caller keeps `bytes`
                    // bytes at `src` valid until the call completes.
                    unsafe { std::slice::from_raw_parts(src as *const u8, bytes) }
                };
                c.put_signal(data, peer, &w, off, at.0, at.1).map_err(Fail::from)
            }
            Op::Signal { peer, at } => c.signal(peer, at.0, at.1).map_err(Fail::from),
            Op::Wait { descs } => c.wait_signal(&descs).map_err(Fail::from),
        }
    }
}

/// The registered window behind a handle whose registration may have been queued.
fn ready_window(state: &Mutex<WinState>, h: usize, arg: &str) -> R<Window> {
    match &*lock(state) {
        WinState::Ready(w) => Ok(*w),
        WinState::Pending => Err(Fail {
            code: INTERNAL_ERROR,
            msg: format!("window {h:#x} is used before its registration ran"),
        }),
        WinState::Failed(why) => Err(invalid(arg, format!("{h:#x}: its registration failed: {why}"))),
        WinState::Gone => Err(invalid(arg, format!("{h:#x} was deregistered"))),
    }
}

/// Runs `ops` on `st` in order; the first failure stops them.
fn run(st: &Pin, ops: Vec<Op>) -> R<()> {
    let c = st.ready()?;
    if st.proxy.pending() > 0 {
        st.proxy.drain();
    }
    st.proxy.check()?;
    let mut ops = ops.into_iter();
    while let Some(op) = ops.next() {
        let func = op.func();
        if let Err(f) = op.run(st, c) {
            // Registrations queued after the failure never run: their handles go.
            for later in ops {
                if let Op::Register { h, state, .. } = later {
                    *lock(&state) = WinState::Failed(format!("an earlier call of its group failed ({func})"));
                    forget(st, h);
                }
            }
            return Err(Fail { msg: format!("{func}: {}", f.msg), ..f });
        }
    }
    Ok(())
}

/// A communicator's one-sided calls of the open group (rule 3).
struct Batch {
    /// Queued work holds no pin: the group's job pins when it runs.
    tomb: &'static Tomb,
    ops: Vec<Op>,
    /// Set once the batch ran or was dropped: later calls start a new one.
    closed: bool,
}

/// Closes its batch when the group's job is dropped unrun (a failed group).
struct CloseOnDrop(Arc<Mutex<Batch>>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        lock(&self.0).closed = true;
    }
}

thread_local! {
    static OPEN: RefCell<Vec<Arc<Mutex<Batch>>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `op` on `st` now, or adds it to the open group's batch for `st` (rule 3).
pub(crate) fn submit(st: &Pin, op: Op) -> R<()> {
    if !ops::in_group() {
        return run(st, vec![op]);
    }
    let open = OPEN.with(|o| {
        let mut o = o.borrow_mut();
        o.retain(|b| !lock(b).closed);
        o.iter().find(|b| lock(b).tomb.handle() == st.handle).cloned()
    });
    if let Some(b) = open {
        lock(&b).ops.push(op);
        return Ok(());
    }
    let tomb = st.tomb();
    let b = Arc::new(Mutex::new(Batch { tomb, ops: vec![op], closed: false }));
    OPEN.with(|o| o.borrow_mut().push(b.clone()));
    let guard = CloseOnDrop(b.clone());
    ops::submit_job(Box::new(move || {
        let ops = {
            let mut g = lock(&guard.0);
            g.closed = true;
            std::mem::take(&mut g.ops)
        };
        let st = tomb.pin()?;
        run(&st, ops).inspect_err(|f| handle::record("ncclGroupEnd", Some(&st), f))
    }))
}
