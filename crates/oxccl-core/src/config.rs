//! Communicator configuration: the one place settings are parsed.
//!
//! A [`Config`] starts from defaults ([`Config::default`]) or from environment variables
//! ([`Config::from_lookup`], which the runtime calls with the process environment); builder
//! methods then override single settings. NCCL's variable names are honoured where NCCL has
//! one; oxccl's own use the `OXCCL_` prefix.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `NCCL_SOCKET_IFNAME` | interfaces to use (see [`crate::ifname`]) | NCCL's order |
//! | `OXCCL_NET_GBIT` | each rail's speed to other hosts, Gbit/s, for the cost model, where the kernel's link speed is not the path's (a shaped or virtual link, a slower switch) | the interface's speed (`/sys/class/net/IF/speed`) |
//! | `NCCL_SOCKET_FAMILY` | `AF_INET` or `AF_INET6` | IPv4 first |
//! | `NCCL_SHM_DISABLE` | `1`: same-host peers use TCP, not shared memory | `0` |
//! | `NCCL_BUFFSIZE` | bytes of buffering per connection | 1 MiB; 4 MiB over TCP |
//! | `NCCL_MIN_NCHANNELS`, `NCCL_MAX_NCHANNELS` | rings a collective is striped over | 1; 2 over TCP |
//! | `NCCL_DEBUG` | `VERSION`, `WARN`, `INFO`, `TRACE` | off |
//! | `NCCL_DEBUG_SUBSYS` | subsystems of INFO lines: `INIT,COLL,P2P,SHM,NET,GRAPH,TUNING,ENV,ALLOC,CALL,BOOTSTRAP,ALL`, `^` to exclude | `INIT,BOOTSTRAP,ENV` |
//! | `NCCL_DEBUG_FILE` | log file (`%h` host, `%p` pid) | stderr |
//! | `NCCL_ALGO`, `NCCL_PROTO` | algorithms / protocols calls may use, NCCL's syntax ([`crate::tuner::Enabled`]) | all |
//! | `OXCCL_DETERMINISTIC` | `1`: reductions fold in rank order, bitwise reproducible whatever the size, algorithm and channels | `0` |
//! | `OXCCL_TUNER` | `0`: no cost model; the built-in rules pick algorithms | `1` |
//! | `OXCCL_CALIBRATE` | `0`: the model's built-in costs; `force`: measure this host again | cached probe |
//! | `OXCCL_TIMEOUT` | seconds a call may wait for peers; `0` = forever | forever |
//! | `OXCCL_WAIT_NOTICE` | seconds between the lines a rank still waiting at init prints on stderr (what it waits for); `0` = none | `30` |
//! | `OXCCL_HOST_ID` | overrides the host identity (ranks with equal ids share memory) | derived |
//! | `OXCCL_DIRECT` | `0`: single-host communicators use the ring engine, not direct memory access | `1` |
//! | `OXCCL_CMA` | `1`: the direct path reads heap buffers of more than 64 KiB straight from peers' processes (`process_vm_readv`, one copy) instead of copying them through shared memory; refused by the kernel, it says why once at `NCCL_DEBUG=INFO` | `0` |
//! | `OXCCL_FLIGHT_RECORDER` | calls each communicator's flight recorder keeps (0: off) | `2000` |
//! | `OXCCL_FLIGHT_DIR` | where flight recorder dumps are written | the temporary directory |
//! | `OXCCL_BOOTSTRAP_SPARSE_FROM` | from this many ranks on, the peer table is relayed down a binary tree of ranks and control connections go to ring and tree neighbours only (`0`: never) | `128` |
//! | `OXCCL_CHECK_CALLS` | `0`: chunks carry no call signatures and none are compared (the contract check is off; for measuring its cost) | `1` |
//!
//! Device buffers and the C ABI's streams ([`DeviceSettings`], process-wide: the runtime reads
//! them once per process):
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `OXCCL_DEVICE_LL` | `0`: small device all-reduces do not run as LL (nor where `NCCL_PROTO` leaves LL out for all-reduce) | `1` |
//! | `OXCCL_DEVICE_LL128` | `0`: nor as LL128 (nor where `NCCL_PROTO` leaves LL128 out) | `1` |
//! | `OXCCL_LL_ALONE` | `0`: a lone small device all-reduce goes through the host meeting too | `1` |
//! | `OXCCL_DEVICE_ENGINE` | `events`: threads of one process on one device use the event engine | `auto` |
//! | `OXCCL_CUDA_IPC` | `0`: processes stage device calls through host memory instead of mapping each other's buffers | `1` |
//! | `OXCCL_STREAM_WAIT` | `kernel`: a stream waits for a staged call by a one-thread polling kernel, not `cuStreamWaitValue32` | `driver` |
//! | `OXCCL_NVRTC` | the `libnvrtc.so` to load first | the loader's search |
//! | `OXCCL_ASYNC_STREAMS` | `0`: a staged call on device buffers returns only once completed | `1` |
//! | `OXCCL_TRACE_STREAMS` | `1`: a line on stderr for each stream-ordered call's steps | `0` |

use crate::error::CoreError;
use crate::ifname::{Family, IfSpec};
use crate::tuning;
use std::time::Duration;

/// NCCL's debug subsystems, as bits.
pub mod subsys {
    pub const INIT: u32 = 1;
    pub const COLL: u32 = 2;
    pub const P2P: u32 = 4;
    pub const SHM: u32 = 8;
    pub const NET: u32 = 16;
    pub const GRAPH: u32 = 32;
    pub const TUNING: u32 = 64;
    pub const ENV: u32 = 128;
    pub const ALLOC: u32 = 256;
    pub const CALL: u32 = 512;
    pub const PROXY: u32 = 1024;
    pub const NVLS: u32 = 2048;
    pub const BOOTSTRAP: u32 = 4096;
    pub const REG: u32 = 8192;
    pub const ALL: u32 = !0;
    /// NCCL's default when `NCCL_DEBUG_SUBSYS` is unset.
    pub const DEFAULT: u32 = INIT | BOOTSTRAP | ENV;

    const NAMES: [(&str, u32); 15] = [
        ("INIT", INIT),
        ("COLL", COLL),
        ("P2P", P2P),
        ("SHM", SHM),
        ("NET", NET),
        ("GRAPH", GRAPH),
        ("TUNING", TUNING),
        ("ENV", ENV),
        ("ALLOC", ALLOC),
        ("CALL", CALL),
        ("PROXY", PROXY),
        ("NVLS", NVLS),
        ("BOOTSTRAP", BOOTSTRAP),
        ("REG", REG),
        ("ALL", ALL),
    ];

    /// Parses a comma list of names; a leading `^` selects all but those.
    pub fn parse(s: &str) -> Result<u32, String> {
        let (neg, list) = match s.trim().strip_prefix('^') {
            Some(l) => (true, l),
            None => (false, s.trim()),
        };
        let mut m = 0u32;
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let bit = NAMES
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(t))
                .map(|x| x.1)
                .ok_or(format!("unknown subsystem {t:?}"))?;
            m |= bit;
        }
        Ok(if neg { !m } else { m })
    }
}

/// How much the library logs to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    #[default]
    Off,
    /// Only the version line.
    Version,
    Warn,
    Info,
    Trace,
}

/// A communicator's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub socket_ifname: Option<IfSpec>,
    /// `OXCCL_NET_GBIT`: each rail's speed to other hosts, Gbit/s (`None`: the interface's
    /// speed as the kernel reports it).
    pub net_gbit: Option<f64>,
    pub socket_family: Option<Family>,
    pub shm_disable: bool,
    /// `NCCL_BUFFSIZE`; unset, the transport's default applies.
    pub buffsize: Option<usize>,
    pub min_channels: usize,
    pub max_channels: usize,
    pub log: LogLevel,
    /// `NCCL_DEBUG_SUBSYS`: which subsystems' INFO lines print ([`subsys`] bits).
    pub log_subsys: u32,
    /// `NCCL_DEBUG_FILE`: where log lines go (`%h` host, `%p` pid); unset: stderr.
    pub log_file: Option<String>,
    pub timeout: Option<Duration>,
    /// How often a rank still waiting at init says on stderr what it waits for
    /// (`OXCCL_WAIT_NOTICE`, seconds; `None`: never).
    pub wait_notice: Option<Duration>,
    pub host_id: Option<String>,
    /// Single-host communicators run collectives by direct memory access (`OXCCL_DIRECT`).
    pub direct: bool,
    /// Which heap-buffer calls the direct path runs by reading peers' processes with
    /// `process_vm_readv`, where the kernel allows it (`OXCCL_CMA`: unset or `auto`, `1`, `0`).
    pub cma: CrossMemory,
    /// Every chunk carries its call's signature and receivers compare it with their own call's
    /// (`OXCCL_CHECK_CALLS`, on by default); every rank of a communicator must agree.
    pub check_calls: bool,
    /// Calls the flight recorder keeps (`OXCCL_FLIGHT_RECORDER`; 0: off).
    pub flight_entries: usize,
    /// Where flight recorder dumps go (`OXCCL_FLIGHT_DIR`; unset: the temporary directory).
    pub flight_dir: Option<std::path::PathBuf>,
    /// `NCCL_ALGO` / `NCCL_PROTO`: the algorithms and protocols calls may use.
    pub enabled: crate::tuner::Enabled,
    /// `OXCCL_DETERMINISTIC`: reductions fold in rank order, bitwise reproducible across sizes,
    /// algorithms and channel counts (every rank must agree).
    pub deterministic: bool,
    /// `OXCCL_TUNER`: calls take the cost model's choices (on by default); off, the built-in
    /// rules (and `NCCL_ALGO` / `NCCL_PROTO`) alone.
    pub tuner: bool,
    /// `OXCCL_CALIBRATE`: `0` built-in costs, `force` measure again; unset, the cached probe.
    pub calibrate: Option<String>,
    /// `OXCCL_BOOTSTRAP_SPARSE_FROM`: the rank count from which the bootstrap relays the peer
    /// table down a tree and keeps control connections to neighbours only (0: never). Rank
    /// 0's value holds for the whole communicator.
    pub bootstrap_sparse_from: usize,
    /// The CUDA device this rank's device buffers are on (NCCL's current device at init);
    /// every rank learns every rank's at init, so all choose the same device engine. Unset:
    /// not known (a rank without CUDA, or a Rust caller that did not say).
    pub cuda_device: Option<i32>,
    /// Device buffers and the C ABI's streams (process-wide settings).
    pub device: DeviceSettings,
}

/// The settings of device buffers and of the C ABI's stream-ordered calls. They hold for the
/// whole process: the runtime reads them once ([`Config::from_lookup`] parses them with the
/// rest, so a bad value fails a communicator's init, naming the variable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSettings {
    /// Small all-reduces on device buffers may run as LL: `OXCCL_DEVICE_LL` not `0` and
    /// `NCCL_PROTO` allowing LL for all-reduce.
    pub ll: bool,
    /// The same for LL128 (`OXCCL_DEVICE_LL128`, `NCCL_PROTO`).
    pub ll128: bool,
    /// A lone small device all-reduce runs as LL without the host meeting (`OXCCL_LL_ALONE`).
    pub ll_alone: bool,
    /// Threads of one process on one device use the event engine (`OXCCL_DEVICE_ENGINE=events`).
    pub engine_events: bool,
    /// Processes may map each other's device buffers by CUDA IPC (`OXCCL_CUDA_IPC`).
    pub cuda_ipc: bool,
    /// A stream waits for a staged call by a polling kernel (`OXCCL_STREAM_WAIT=kernel`).
    pub stream_wait_kernel: bool,
    /// The NVRTC library to try first (`OXCCL_NVRTC`).
    pub nvrtc: Option<String>,
    /// Staged calls return once enqueued (`OXCCL_ASYNC_STREAMS`, on by default).
    pub async_streams: bool,
    /// Stream-ordered calls trace their steps on stderr (`OXCCL_TRACE_STREAMS=1`).
    pub trace_streams: bool,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        DeviceSettings {
            ll: true,
            ll128: true,
            ll_alone: true,
            engine_events: false,
            cuda_ipc: true,
            stream_wait_kernel: false,
            nvrtc: None,
            async_streams: true,
            trace_streams: false,
        }
    }
}

impl DeviceSettings {
    /// The device settings `get` describes; `enabled` is the parsed `NCCL_ALGO`/`NCCL_PROTO`.
    fn from_lookup(
        get: &impl Fn(&str) -> Option<String>,
        enabled: &crate::tuner::Enabled,
    ) -> Result<DeviceSettings, CoreError> {
        use crate::tuner::{Proto, RingColl};
        let flag = |var: &str, default: bool| match get(var) {
            Some(v) if !v.trim().is_empty() => parse_bool(var, &v),
            _ => Ok(default),
        };
        let choice = |var: &str, default: &str, on: &str| -> Result<bool, CoreError> {
            match get(var).map(|v| v.trim().to_ascii_lowercase()) {
                None => Ok(false),
                Some(v) if v.is_empty() || v == default => Ok(false),
                Some(v) if v == on => Ok(true),
                Some(v) => Err(bad(var, &v, &format!("expected {on} or {default}"))),
            }
        };
        let all_reduce = |p: Proto| enabled.proto[RingColl::AllReduce as usize][p as usize];
        Ok(DeviceSettings {
            ll: flag("OXCCL_DEVICE_LL", true)? && all_reduce(Proto::LL),
            ll128: flag("OXCCL_DEVICE_LL128", true)? && all_reduce(Proto::LL128),
            ll_alone: flag("OXCCL_LL_ALONE", true)?,
            engine_events: choice("OXCCL_DEVICE_ENGINE", "auto", "events")?,
            cuda_ipc: flag("OXCCL_CUDA_IPC", true)?,
            stream_wait_kernel: choice("OXCCL_STREAM_WAIT", "driver", "kernel")?,
            nvrtc: get("OXCCL_NVRTC").filter(|v| !v.is_empty()),
            async_streams: flag("OXCCL_ASYNC_STREAMS", true)?,
            trace_streams: flag("OXCCL_TRACE_STREAMS", false)?,
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket_ifname: None,
            net_gbit: None,
            socket_family: None,
            shm_disable: false,
            buffsize: None,
            min_channels: 1,
            max_channels: tuning::MAX_CHANNELS,
            log: LogLevel::Off,
            log_subsys: subsys::DEFAULT,
            log_file: None,
            timeout: None,
            wait_notice: Some(Duration::from_secs(tuning::WAIT_NOTICE_S)),
            host_id: None,
            direct: true,
            cma: CrossMemory::Auto,
            check_calls: true,
            flight_entries: 2000,
            flight_dir: None,
            enabled: crate::tuner::Enabled::default(),
            deterministic: false,
            tuner: true,
            calibrate: None,
            bootstrap_sparse_from: tuning::BOOTSTRAP_SPARSE_FROM,
            cuda_device: None,
            device: DeviceSettings::default(),
        }
    }
}

fn bad(var: &str, value: &str, reason: &str) -> CoreError {
    CoreError::BadSetting { var: var.to_string(), value: value.to_string(), reason: reason.to_string() }
}

/// Which heap-buffer calls of the direct path read peers' processes (`OXCCL_CMA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CrossMemory {
    /// `OXCCL_CMA=0`: none; heap calls beyond the inline area take the ring.
    Off,
    /// Unset or `auto`: the kinds and sizes where one kernel copy beat the two shared-memory
    /// copies when measured ([`crate::plan::hostdirect::cma_auto`] beyond the inline area,
    /// [`crate::plan::hostdirect::cma_over_inline`] within it).
    #[default]
    Auto,
    /// `OXCCL_CMA=1`: every collective beyond the inline area; within it, as `Auto`.
    All,
}

fn parse_bool(var: &str, v: &str) -> Result<bool, CoreError> {
    match v.trim() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(bad(var, v, "expected 0 or 1")),
    }
}

fn parse_usize(var: &str, v: &str) -> Result<usize, CoreError> {
    v.trim().parse::<usize>().map_err(|_| bad(var, v, "expected a non-negative integer"))
}

impl Config {
    /// Defaults overridden by environment variables, looked up with `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, CoreError> {
        let mut c = Config::default();
        if let Some(v) = get("NCCL_SOCKET_IFNAME").filter(|v| !v.trim().is_empty()) {
            c.socket_ifname = Some(IfSpec::parse(&v));
        }
        if let Some(v) = get("NCCL_SOCKET_FAMILY").filter(|v| !v.trim().is_empty()) {
            c.socket_family = Some(
                Family::parse(&v)
                    .ok_or_else(|| bad("NCCL_SOCKET_FAMILY", &v, "expected AF_INET or AF_INET6"))?,
            );
        }
        if let Some(v) = get("NCCL_SHM_DISABLE") {
            c.shm_disable = parse_bool("NCCL_SHM_DISABLE", &v)?;
        }
        if let Some(v) = get("NCCL_BUFFSIZE") {
            c.buffsize = Some(parse_usize("NCCL_BUFFSIZE", &v)?);
        }
        if let Some(v) = get("NCCL_MIN_NCHANNELS") {
            c.min_channels = parse_usize("NCCL_MIN_NCHANNELS", &v)?;
        }
        if let Some(v) = get("NCCL_MAX_NCHANNELS") {
            c.max_channels = parse_usize("NCCL_MAX_NCHANNELS", &v)?;
        }
        if let Some(v) = get("NCCL_DEBUG") {
            c.log = match v.trim().to_ascii_uppercase().as_str() {
                "" | "NONE" => LogLevel::Off,
                "VERSION" => LogLevel::Version,
                "WARN" => LogLevel::Warn,
                "INFO" => LogLevel::Info,
                "TRACE" => LogLevel::Trace,
                _ => return Err(bad("NCCL_DEBUG", &v, "expected VERSION, WARN, INFO or TRACE")),
            };
        }
        if let Some(v) = get("NCCL_DEBUG_SUBSYS").filter(|v| !v.trim().is_empty()) {
            c.log_subsys = subsys::parse(&v).map_err(|e| bad("NCCL_DEBUG_SUBSYS", &v, &e))?;
        }
        if let Some(v) = get("NCCL_DEBUG_FILE").filter(|v| !v.trim().is_empty()) {
            c.log_file = Some(v);
        }
        if let Some(v) = get("OXCCL_TIMEOUT") {
            let secs: f64 = v.trim().parse().map_err(|_| bad("OXCCL_TIMEOUT", &v, "expected seconds"))?;
            if !(secs >= 0.0 && secs.is_finite()) {
                return Err(bad("OXCCL_TIMEOUT", &v, "expected a non-negative number of seconds"));
            }
            c.timeout = (secs > 0.0).then(|| Duration::from_secs_f64(secs));
        }
        if let Some(v) = get("OXCCL_NET_GBIT").filter(|v| !v.trim().is_empty()) {
            let g: f64 = v.trim().parse().map_err(|_| bad("OXCCL_NET_GBIT", &v, "expected Gbit/s"))?;
            if !(g > 0.0 && g.is_finite()) {
                return Err(bad(
                    "OXCCL_NET_GBIT",
                    &v,
                    "expected a positive number of Gbit/s (e.g. 1, 10, 100)",
                ));
            }
            c.net_gbit = Some(g);
        }
        if let Some(v) = get("OXCCL_WAIT_NOTICE") {
            let secs: f64 = v.trim().parse().map_err(|_| bad("OXCCL_WAIT_NOTICE", &v, "expected seconds"))?;
            if !(secs >= 0.0 && secs.is_finite()) {
                return Err(bad("OXCCL_WAIT_NOTICE", &v, "expected a non-negative number of seconds"));
            }
            c.wait_notice = (secs > 0.0).then(|| Duration::from_secs_f64(secs));
        }
        if let Some(v) = get("OXCCL_FLIGHT_RECORDER") {
            c.flight_entries = v
                .trim()
                .parse()
                .map_err(|_| bad("OXCCL_FLIGHT_RECORDER", &v, "expected a number of calls"))?;
        }
        if let Some(v) = get("OXCCL_FLIGHT_DIR") {
            if !v.trim().is_empty() {
                c.flight_dir = Some(std::path::PathBuf::from(v.trim()));
            }
        }
        if let Some(v) = get("OXCCL_CHECK_CALLS") {
            c.check_calls = parse_bool("OXCCL_CHECK_CALLS", &v)?;
        }
        if let Some(v) = get("OXCCL_DETERMINISTIC") {
            c.deterministic = parse_bool("OXCCL_DETERMINISTIC", &v)?;
        }
        if let Some(v) = get("OXCCL_TUNER") {
            c.tuner = parse_bool("OXCCL_TUNER", &v)?;
        }
        if let Some(v) = get("OXCCL_CALIBRATE").filter(|v| !v.trim().is_empty()) {
            c.calibrate = Some(v);
        }
        if let Some(v) = get("OXCCL_BOOTSTRAP_SPARSE_FROM") {
            c.bootstrap_sparse_from = parse_usize("OXCCL_BOOTSTRAP_SPARSE_FROM", &v)?;
        }
        if let Some(v) = get("OXCCL_DIRECT") {
            c.direct = parse_bool("OXCCL_DIRECT", &v)?;
        }
        if let Some(v) = get("OXCCL_CMA") {
            c.cma = match v.trim() {
                "auto" | "" => CrossMemory::Auto,
                x => match parse_bool("OXCCL_CMA", x) {
                    Ok(true) => CrossMemory::All,
                    Ok(false) => CrossMemory::Off,
                    Err(_) => return Err(bad("OXCCL_CMA", &v, "expected 0, 1 or auto")),
                },
            };
        }
        let algo = get("NCCL_ALGO").filter(|v| !v.trim().is_empty());
        let proto = get("NCCL_PROTO").filter(|v| !v.trim().is_empty());
        if algo.is_some() || proto.is_some() {
            c.enabled = crate::tuner::Enabled::parse(algo.as_deref(), proto.as_deref()).map_err(|e| {
                let (var, val) = if e.starts_with("NCCL_ALGO") {
                    ("NCCL_ALGO", algo.clone())
                } else {
                    ("NCCL_PROTO", proto.clone())
                };
                bad(var, &val.unwrap_or_default(), e.split_once(": ").map_or(e.as_str(), |x| x.1))
            })?;
        }
        if let Some(v) = get("OXCCL_HOST_ID").filter(|v| !v.is_empty()) {
            c.host_id = Some(v);
        }
        c.device = DeviceSettings::from_lookup(&get, &c.enabled)?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the settings' ranges.
    pub fn validate(&self) -> Result<(), CoreError> {
        let buffsize = self.buffsize.unwrap_or(tuning::DEFAULT_BUFFSIZE_BYTES);
        if !(tuning::MIN_BUFFSIZE_BYTES..=tuning::MAX_BUFFSIZE_BYTES).contains(&buffsize) {
            return Err(bad(
                "NCCL_BUFFSIZE",
                &buffsize.to_string(),
                &format!(
                    "must be within {}..={} bytes",
                    tuning::MIN_BUFFSIZE_BYTES,
                    tuning::MAX_BUFFSIZE_BYTES
                ),
            ));
        }
        let min = self.min_channels;
        if min == 0 || self.max_channels == 0 || min > tuning::MAX_CHANNELS {
            return Err(bad(
                "NCCL_MIN_NCHANNELS",
                &min.to_string(),
                &format!("channel counts must be within 1..={}", tuning::MAX_CHANNELS),
            ));
        }
        Ok(())
    }

    /// The number of ring channels collectives use; `net`: the rings cross sockets, whose
    /// per-chunk latency more channels in flight hide.
    pub fn channels(&self, net: bool) -> usize {
        let default = if net { tuning::NET_CHANNELS } else { tuning::DEFAULT_CHANNELS };
        let min = self.min_channels;
        default.max(min).min(self.max_channels.max(min)).min(tuning::MAX_CHANNELS)
    }

    /// Bytes of buffering per connection: `NCCL_BUFFSIZE`, or the default of the transport
    /// (`net`: sockets, which want larger chunks per system call and round trip).
    pub fn buffsize(&self, net: bool) -> usize {
        let default = if net { tuning::NET_BUFFSIZE_BYTES } else { tuning::DEFAULT_BUFFSIZE_BYTES };
        self.buffsize.unwrap_or(default)
    }

    /// Bytes per connection slot: the buffer divided into the pipeline's slots, a multiple of
    /// 8 bytes (so every data type chunks to the same byte boundaries).
    pub fn slot_bytes(&self, net: bool) -> usize {
        (self.buffsize(net) / tuning::SLOTS_PER_CONN / 8 * 8).max(8)
    }

    pub fn with_timeout(mut self, t: Option<Duration>) -> Self {
        self.timeout = t;
        self
    }

    pub fn with_shm_disabled(mut self, disabled: bool) -> Self {
        self.shm_disable = disabled;
        self
    }

    pub fn with_socket_ifname(mut self, spec: &str) -> Self {
        self.socket_ifname = Some(IfSpec::parse(spec));
        self
    }

    pub fn with_buffsize(mut self, bytes: usize) -> Self {
        self.buffsize = Some(bytes);
        self
    }

    pub fn with_channels(mut self, n: usize) -> Self {
        self.min_channels = n;
        self.max_channels = n;
        self
    }

    pub fn with_host_id(mut self, id: &str) -> Self {
        self.host_id = Some(id.to_string());
        self
    }

    /// `OXCCL_CMA=1` (`true`) or `=0` (`false`).
    pub fn with_cma(mut self, on: bool) -> Self {
        self.cma = if on { CrossMemory::All } else { CrossMemory::Off };
        self
    }

    pub fn with_cross_memory(mut self, c: CrossMemory) -> Self {
        self.cma = c;
        self
    }

    pub fn with_direct(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }

    pub fn with_log(mut self, level: LogLevel) -> Self {
        self.log = level;
        self
    }

    /// `OXCCL_BOOTSTRAP_SPARSE_FROM` (0: never sparse).
    pub fn with_bootstrap_sparse_from(mut self, ranks: usize) -> Self {
        self.bootstrap_sparse_from = ranks;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn parses_nccl_variables() {
        let c = Config::from_lookup(env(&[
            ("NCCL_SOCKET_IFNAME", "^docker,lo"),
            ("NCCL_SHM_DISABLE", "1"),
            ("NCCL_BUFFSIZE", "4194304"),
            ("NCCL_MIN_NCHANNELS", "2"),
            ("OXCCL_TIMEOUT", "2.5"),
            ("NCCL_DEBUG", "info"),
        ]))
        .unwrap();
        assert!(c.shm_disable);
        assert!(c.socket_ifname.as_ref().unwrap().exclude);
        assert_eq!(c.buffsize, Some(4 << 20));
        assert_eq!(c.channels(false), 2);
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(c.log, LogLevel::Info);
        assert_eq!(c.slot_bytes(false) % 8, 0);
    }

    #[test]
    fn sockets_get_larger_buffers_and_more_rings_unless_set() {
        let c = Config::default();
        assert_eq!((c.buffsize(false), c.channels(false)), (tuning::DEFAULT_BUFFSIZE_BYTES, 1));
        assert_eq!((c.buffsize(true), c.channels(true)), (tuning::NET_BUFFSIZE_BYTES, tuning::NET_CHANNELS));
        assert_eq!(c.slot_bytes(true), tuning::NET_BUFFSIZE_BYTES / tuning::SLOTS_PER_CONN);
        let c = Config::from_lookup(env(&[("NCCL_BUFFSIZE", "65536"), ("NCCL_MAX_NCHANNELS", "1")])).unwrap();
        assert_eq!((c.buffsize(true), c.channels(true)), (65536, 1));
        let c = Config::from_lookup(env(&[("NCCL_MIN_NCHANNELS", "3")])).unwrap();
        assert_eq!((c.channels(false), c.channels(true)), (3, 3));
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = Config::from_lookup(env(&[("NCCL_SHM_DISABLE", "maybe")])).unwrap_err();
        assert!(e.to_string().contains("NCCL_SHM_DISABLE"), "{e}");
        let e = Config::from_lookup(env(&[("OXCCL_TIMEOUT", "-1")])).unwrap_err();
        assert!(e.to_string().contains("OXCCL_TIMEOUT"), "{e}");
        let e = Config::from_lookup(env(&[("NCCL_BUFFSIZE", "10")])).unwrap_err();
        assert!(e.to_string().contains("NCCL_BUFFSIZE"), "{e}");
        assert_eq!(Config::from_lookup(env(&[("OXCCL_TIMEOUT", "0")])).unwrap().timeout, None);
        let e = Config::from_lookup(env(&[("OXCCL_CMA", "yes please")])).unwrap_err();
        assert!(e.to_string().contains("OXCCL_CMA"), "{e}");
        for v in ["0", "-1", "fast", "inf"] {
            let e = Config::from_lookup(env(&[("OXCCL_NET_GBIT", v)])).unwrap_err();
            assert!(e.to_string().contains("OXCCL_NET_GBIT"), "{v}: {e}");
        }
        assert_eq!(Config::from_lookup(env(&[("OXCCL_NET_GBIT", "2.5")])).unwrap().net_gbit, Some(2.5));
        assert_eq!(Config::default().net_gbit, None);
    }

    #[test]
    fn cross_memory_reads_are_asked_for() {
        assert_eq!(Config::default().cma, CrossMemory::Auto);
        assert_eq!(Config::from_lookup(env(&[("OXCCL_CMA", "auto")])).unwrap().cma, CrossMemory::Auto);
        assert_eq!(Config::from_lookup(env(&[("OXCCL_CMA", "1")])).unwrap().cma, CrossMemory::All);
        assert_eq!(Config::from_lookup(env(&[("OXCCL_CMA", "0")])).unwrap().cma, CrossMemory::Off);
        let e = Config::from_lookup(env(&[("OXCCL_CMA", "sometimes")])).unwrap_err().to_string();
        assert!(e.contains("OXCCL_CMA") && e.contains("sometimes"), "{e}");
    }

    #[test]
    fn nccl_proto_and_the_device_flags_decide_whether_ll_and_ll128_run() {
        let dev = |vars: &[(&str, &str)]| Config::from_lookup(env(vars)).unwrap().device;
        let proto = |v: &str| {
            let d = dev(&[("NCCL_PROTO", v)]);
            (d.ll, d.ll128)
        };
        assert_eq!((dev(&[]).ll, dev(&[]).ll128), (true, true));
        assert_eq!(proto(""), (true, true));
        assert_eq!(proto("LL,Simple"), (true, false));
        assert_eq!(proto("ll128,ll"), (true, true));
        assert_eq!(proto("Simple"), (false, false));
        assert_eq!(proto("LL128"), (false, true));
        assert_eq!(proto("simple, ll128"), (false, true));
        assert_eq!(proto("^LL"), (false, true));
        assert_eq!(proto("^LL128"), (true, false));
        // Per collective: only all-reduce's list counts on device buffers.
        assert_eq!(proto("allreduce:Simple;broadcast:LL"), (false, false));
        assert_eq!(proto("broadcast:Simple"), (true, true));
        assert!(!dev(&[("OXCCL_DEVICE_LL", "0")]).ll);
        assert!(dev(&[("OXCCL_DEVICE_LL", "0")]).ll128);
        assert!(!dev(&[("OXCCL_DEVICE_LL128", "0")]).ll128);
        assert!(!dev(&[("OXCCL_LL_ALONE", "0")]).ll_alone);
    }

    #[test]
    fn device_settings_parse_once_and_name_a_bad_value() {
        let d = Config::from_lookup(env(&[])).unwrap().device;
        assert_eq!(d, DeviceSettings::default());
        let d = Config::from_lookup(env(&[
            ("OXCCL_DEVICE_ENGINE", "events"),
            ("OXCCL_CUDA_IPC", "0"),
            ("OXCCL_STREAM_WAIT", "kernel"),
            ("OXCCL_NVRTC", "/opt/nvrtc/libnvrtc.so.13"),
            ("OXCCL_ASYNC_STREAMS", "0"),
            ("OXCCL_TRACE_STREAMS", "1"),
        ]))
        .unwrap()
        .device;
        assert!(
            d.engine_events && !d.cuda_ipc && d.stream_wait_kernel && !d.async_streams && d.trace_streams
        );
        assert_eq!(d.nvrtc.as_deref(), Some("/opt/nvrtc/libnvrtc.so.13"));
        let d = Config::from_lookup(env(&[("OXCCL_DEVICE_ENGINE", "auto"), ("OXCCL_STREAM_WAIT", "driver")]))
            .unwrap()
            .device;
        assert!(!d.engine_events && !d.stream_wait_kernel);
        for (var, v) in [
            ("OXCCL_DEVICE_ENGINE", "event"),
            ("OXCCL_STREAM_WAIT", "spin"),
            ("OXCCL_CUDA_IPC", "maybe"),
            ("OXCCL_ASYNC_STREAMS", "2"),
        ] {
            let e = Config::from_lookup(env(&[(var, v)])).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(v), "{var}={v}: {e}");
        }
    }
}
