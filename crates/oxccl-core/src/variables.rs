//! The one table of the environment variables oxccl reads (`NCCL_*` and `OXCCL_*`): each with
//! its default and meaning, in the order users meet them. `oxccl env` prints it with this
//! process's values; `ncclParamDumpAll` lists the same names.
//!
//! Rules:
//! 1. Each variable is parsed in one place: [`crate::config::Config::from_lookup`] (settings),
//!    [`crate::launch::detect`] (the launcher's), the runtime's `oxccl::env` (cache
//!    directories) or `oxccl::topo::system` (the topology, through the lookup it is given);
//!    the runtime reads the environment only through `oxccl::env`.
//! 2. Every variable those readers name is in [`ALL`], and every entry of [`ALL`] is read:
//!    `crates/oxccl/tests/layering.rs` checks both against the readers' source.

/// Which part of oxccl reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// `Config::from_lookup`: a communicator's (and the process's device) settings.
    Settings,
    /// `launch::detect`: who this process is in the job, and how ranks meet.
    Launcher,
    /// `oxccl::env`: where caches live.
    Cache,
    /// `oxccl::topo::system`: the machine's topology.
    Topology,
}

/// One variable: its name, who reads it, its default (as users would write it, or what
/// happens when unset) and what it does.
#[derive(Clone, Copy, Debug)]
pub struct Variable {
    pub name: &'static str,
    pub reader: Reader,
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn v(name: &'static str, reader: Reader, default: &'static str, meaning: &'static str) -> Variable {
    Variable { name, reader, default, meaning }
}

use Reader::{Cache, Launcher, Settings, Topology};

/// Every variable oxccl reads.
pub const ALL: &[Variable] = &[
    v("NCCL_SOCKET_IFNAME", Settings, "ib*, then any but docker*, virbr*, lo; then those", "interfaces for bootstrap and TCP (prefix list; ^ excludes, = exact)"),
    v("NCCL_SOCKET_FAMILY", Settings, "either", "AF_INET or AF_INET6 only"),
    v("NCCL_SHM_DISABLE", Settings, "0", "1: no shared memory between ranks of a host (TCP instead)"),
    v("NCCL_BUFFSIZE", Settings, "1 MiB (4 MiB over TCP)", "bytes of one connection slot"),
    v("NCCL_MIN_NCHANNELS", Settings, "1", "fewest channels a collective uses"),
    v("NCCL_MAX_NCHANNELS", Settings, "32", "most channels a collective uses"),
    v("NCCL_ALGO", Settings, "all", "algorithms allowed (ring, tree, direct; per collective: allreduce:tree)"),
    v("NCCL_PROTO", Settings, "all", "protocols allowed (LL, LL128, Simple; ^ excludes)"),
    v("NCCL_DEBUG", Settings, "none (errors are returned, not logged)", "VERSION, WARN, INFO or TRACE"),
    v("NCCL_DEBUG_SUBSYS", Settings, "all", "subsystems INFO logs (INIT, COLL, P2P, NET, BOOTSTRAP, …; ^ excludes)"),
    v("NCCL_DEBUG_FILE", Settings, "stderr", "log file (%h host, %p pid)"),
    v("OXCCL_NET_GBIT", Settings, "the interface's speed (/sys/class/net)", "each rail's speed to other hosts, Gbit/s, for the cost model where the kernel's is not the path's"),
    v("OXCCL_TIMEOUT", Settings, "none", "seconds a call or init may wait before failing, naming who it waits for"),
    v("OXCCL_WAIT_NOTICE", Settings, "30", "seconds between notices on stderr of a long wait at init (0: none)"),
    v("OXCCL_FLIGHT_RECORDER", Settings, "2000", "calls the flight recorder keeps (dumped on failure or SIGUSR1; 0: none)"),
    v("OXCCL_FLIGHT_DIR", Settings, "the temporary directory", "where flight recorder dumps go"),
    v("OXCCL_CHECK_CALLS", Settings, "1", "check that every rank makes the same calls (the contract check)"),
    v("OXCCL_DETERMINISTIC", Settings, "0", "1: reductions fold in rank order, bitwise the same across sizes, algorithms and channels"),
    v("OXCCL_TUNER", Settings, "1", "0: the built-in rules (and NCCL_ALGO / NCCL_PROTO) instead of the cost model"),
    v("OXCCL_CALIBRATE", Settings, "the cached probe", "host costs: 0 built-in values, force: measure again"),
    v("OXCCL_BOOTSTRAP_SPARSE_FROM", Settings, "128", "world size from which the bootstrap relays the table and keeps neighbour lifelines (0: never; rank 0's holds)"),
    v("OXCCL_DIRECT", Settings, "1", "0: no direct path between the ranks of one host"),
    v("OXCCL_CMA", Settings, "auto", "cross-memory pulls from peers' heaps: 0, 1 or auto"),
    v("OXCCL_HOST_ID", Settings, "the machine's", "host identity (ranks with the same id share memory)"),
    v("OXCCL_DEVICE_LL", Settings, "1", "device path: LL for small all-reduces"),
    v("OXCCL_DEVICE_LL128", Settings, "1", "device path: LL128 where the path keeps 128-byte stores in order"),
    v("OXCCL_LL_ALONE", Settings, "1", "device path: a lone small all-reduce runs as LL without meeting"),
    v("OXCCL_DEVICE_ENGINE", Settings, "auto", "device path: events makes threads on one device use the event engine"),
    v("OXCCL_CUDA_IPC", Settings, "1", "device path: 0 stages processes' calls instead of mapping each other's buffers"),
    v("OXCCL_STREAM_WAIT", Settings, "driver", "staged calls' stream wait: driver (cuStreamWaitValue32) or kernel (a polling kernel)"),
    v("OXCCL_NVRTC", Settings, "libnvrtc.so on the loader's path", "the NVRTC library kernels are compiled with"),
    v("OXCCL_ASYNC_STREAMS", Settings, "1", "C ABI: 0 makes a staged call return only once its outputs are on the device"),
    v("OXCCL_TRACE_STREAMS", Settings, "0", "C ABI: 1 traces stream-ordered calls' steps on stderr"),
    v("OXCCL_RANK", Launcher, "from the launcher", "this process's rank"),
    v("OXCCL_WORLD_SIZE", Launcher, "from the launcher", "the job's world size"),
    v("OXCCL_LOCAL_RANK", Launcher, "from the launcher", "this process's rank on its host"),
    v("OXCCL_UNIQUE_ID", Launcher, "none", "the unique id's text, given to every rank"),
    v("OXCCL_UNIQUE_ID_FILE", Launcher, "none", "a file rank 0 writes the unique id to and the others read"),
    v("OXCCL_ROOT_ADDR", Launcher, "none", "host:port rank 0 listens on for the rendezvous"),
    v("OXCCL_SECRET", Launcher, "derived from the job", "the rendezvous secret with OXCCL_ROOT_ADDR"),
    v("NCCL_TOPO_FILE", Topology, "this host's, detected", "a topology file (JSON) to use instead"),
    v("NCCL_TOPO_DUMP_FILE", Topology, "none", "where to write the topology used"),
    v("OXCCL_CACHE_DIR", Cache, "$XDG_CACHE_HOME/oxccl or ~/.cache/oxccl", "where per-host measurements and kernels are cached"),
    v("OXCCL_KERNEL_CACHE", Cache, "the cache directory", "where compiled kernels are kept (0: nowhere)"),
];

/// The entry of `name`, if oxccl reads it.
pub fn find(name: &str) -> Option<&'static Variable> {
    ALL.iter().find(|x| x.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_read_is_in_the_table_once() {
        let asked = std::cell::RefCell::new(Vec::<String>::new());
        let _ = crate::config::Config::from_lookup(|k| {
            asked.borrow_mut().push(k.to_string());
            None
        });
        for k in asked.into_inner() {
            assert!(
                find(&k).is_some_and(|x| x.reader == Reader::Settings),
                "{k} is read but not in the table"
            );
        }
        let mut names: Vec<&str> = ALL.iter().map(|x| x.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a variable is listed twice");
        assert!(ALL.iter().all(|x| x.name.starts_with("NCCL_") || x.name.starts_with("OXCCL_")));
    }
}
