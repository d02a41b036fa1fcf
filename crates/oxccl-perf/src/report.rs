//! nccl-tests' number formats, and the `-J` results file ([`Results`], nccl-tests' JSON layout,
//! read back by `--plot` and the bench scripts).
//!
//! Rules: the file's keys and nesting are nccl-tests'; integers are integers; a measurement
//! that is not finite (a time of 0 makes an infinite bandwidth) is written `null`.

use oxccl_core::json;
use serde::{Deserialize, Serialize};

/// C's `%*.{p}e`: mantissa with `p` decimals, exponent with a sign and at least two digits.
fn c_exp(v: f64, prec: usize) -> String {
    let s = format!("{v:.prec$e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

/// nccl-tests' `getFloatStr`: the value in `width` columns with 2, 1 or 0 decimals, else in
/// exponent form.
pub fn float_str(v: f64, width: usize) -> String {
    for p in [2usize, 1, 0] {
        let s = format!("{v:>width$.p$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = c_exp(v, if width >= 7 { 1 } else { 0 });
    format!("{s:>width$}")
}

/// C's `%6g` for a count.
pub fn g6(v: f64) -> String {
    let s = if v.abs() < 1e6 && v.fract() == 0.0 {
        format!("{}", v as i64)
    } else {
        let e = c_exp(v, 5);
        // %g drops trailing zeros of the mantissa.
        match e.split_once('e') {
            Some((m, x)) => format!("{}e{x}", m.trim_end_matches('0').trim_end_matches('.')),
            None => e,
        }
    };
    format!("{s:>6}")
}

/// A `-J` results file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// `oxccl P=<ranks>`: the name `--plot` gives the line.
    pub label: String,
    pub library: String,
    pub benchmark: String,
    pub config: RunConfig,
    pub devices: Vec<Device>,
    pub results: Vec<Row>,
    pub out_of_bounds: OutOfBounds,
    pub average_bus_bandwidth: AverageBusBandwidth,
    /// Why the run stopped early (empty: it did not).
    pub errors: Vec<String>,
}

impl Results {
    /// The file's text.
    pub fn to_json(&self) -> String {
        json::to_text(self)
    }
}

/// The run's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub nthreads: u64,
    pub ngpus: u64,
    pub minimum_bytes: u64,
    pub maximum_bytes: u64,
    /// One of the two steps: by factor (`-f`) or by bytes (`-i`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_factor: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_bytes: Option<u64>,
    pub warmup_iters: u64,
    pub iterations: u64,
    pub aggregated_iterations: u64,
    pub validation: u64,
    pub blocking_collectives: bool,
    pub per_iter_timing: bool,
    pub registered_buffers: bool,
    pub nranks: u64,
}

/// One rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub rank: u64,
    pub group: u64,
    pub pid: u64,
    pub hostname: String,
    pub device: String,
    pub device_info: String,
}

/// One size of one type, operator and root.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Bytes.
    pub size: u64,
    /// Elements.
    pub count: u64,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    /// -1: the benchmark has no root.
    pub root: i64,
    pub out_of_place: Timing,
    pub in_place: Timing,
    pub actual_iterations: u64,
    pub experiment_name: String,
}

/// The numbers of one column (out of place or in place).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// µs per call: wall-clock (`time`) or, with `-C`, CPU time (`cpu_time`).
    #[serde(flatten)]
    pub time: Time,
    /// GB/s.
    pub alg_bw: Option<f64>,
    pub bus_bw: Option<f64>,
    /// Wrong elements (`null`: not checked).
    pub nwrong: Option<u64>,
}

/// Which time a column reports, under its key.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Time {
    #[serde(rename = "time")]
    Wall(Option<f64>),
    #[serde(rename = "cpu_time")]
    Cpu(Option<f64>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutOfBounds {
    pub count: u64,
    pub okay: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AverageBusBandwidth {
    pub bandwidth: Option<f64>,
    /// nccl-tests' check against a wanted bandwidth; oxccl-perf has none: `unchecked`.
    pub okay: String,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn c_formats() {
        assert_eq!(float_str(12.345, 7), "  12.35");
        assert_eq!(float_str(123456.7, 7), " 123457");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(1234.5, 6), "1234.5");
        assert_eq!(g6(0.0), "     0");
        assert_eq!(g6(42.0), "    42");
        assert_eq!(g6(1234567.0), "1.23457e+06");
    }

    /// Proptest strategies the results formats' tests share.
    pub(crate) mod strategies {
        use proptest::prelude::*;

        /// Any text, with the characters JSON codecs get wrong more likely.
        pub(crate) fn text() -> impl Strategy<Value = String> {
            let c =
                prop_oneof![any::<char>(), Just('\u{8}'), Just('\u{c}'), Just('\r'), Just('"'), Just('😀')];
            prop::collection::vec(c, 0..8).prop_map(String::from_iter)
        }

        /// A measurement: any finite number, or none (`null`).
        pub(crate) fn measured() -> impl Strategy<Value = Option<f64>> {
            prop::option::of(prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL | prop::num::f64::ZERO)
        }
    }

    mod results_format {
        use super::strategies::{measured, text};
        use super::*;
        use proptest::prelude::*;

        fn timing() -> impl Strategy<Value = Timing> {
            (any::<bool>(), measured(), measured(), measured(), any::<Option<u64>>()).prop_map(
                |(cpu, t, alg_bw, bus_bw, nwrong)| Timing {
                    time: if cpu { Time::Cpu(t) } else { Time::Wall(t) },
                    alg_bw,
                    bus_bw,
                    nwrong,
                },
            )
        }

        prop_compose! {
            fn row()(
                size in any::<u64>(), count in any::<u64>(), dtype in text(), redop in text(),
                root in any::<i64>(), out_of_place in timing(), in_place in timing(),
                actual_iterations in any::<u64>(), experiment_name in text(),
            ) -> Row {
                Row { size, count, dtype, redop, root, out_of_place, in_place, actual_iterations, experiment_name }
            }
        }

        prop_compose! {
            fn config()(n in prop::array::uniform8(any::<u64>()), by_factor in any::<bool>(), flags in any::<[bool; 3]>()) -> RunConfig {
                RunConfig {
                    nthreads: n[0], ngpus: n[1], minimum_bytes: n[2], maximum_bytes: n[3],
                    step_factor: by_factor.then_some(n[4]), step_bytes: (!by_factor).then_some(n[4]),
                    warmup_iters: n[5], iterations: n[6], aggregated_iterations: n[7], validation: n[0] ^ n[7],
                    blocking_collectives: flags[0], per_iter_timing: flags[1], registered_buffers: flags[2],
                    nranks: n[1] ^ n[6],
                }
            }
        }

        prop_compose! {
            fn results()(
                label in text(), library in text(), benchmark in text(), config in config(),
                devices in prop::collection::vec((any::<[u64; 3]>(), text(), text(), text()), 0..3),
                results in prop::collection::vec(row(), 0..4), count in any::<u64>(), okay in any::<bool>(),
                bandwidth in measured(), errors in prop::collection::vec(text(), 0..2),
            ) -> Results {
                let devices = devices
                    .into_iter()
                    .map(|([rank, group, pid], hostname, device, device_info)| Device { rank, group, pid, hostname, device, device_info })
                    .collect();
                Results {
                    label, library, benchmark, config, devices, results,
                    out_of_bounds: OutOfBounds { count, okay },
                    average_bus_bandwidth: AverageBusBandwidth { bandwidth, okay: "unchecked".into() },
                    errors,
                }
            }
        }

        proptest! {
            #[test]
            fn any_results_file_round_trips_exactly(r in results()) {
                prop_assert_eq!(json::parse::<Results>(&r.to_json()).unwrap(), r);
            }
        }

        fn sample() -> Results {
            let t = Timing {
                time: Time::Wall(Some(12.5)),
                alg_bw: Some(0.5),
                bus_bw: Some(0.75),
                nwrong: Some(0),
            };
            Results {
                label: "oxccl P=2".into(),
                library: "oxccl 0.1.0".into(),
                benchmark: "all_reduce_perf".into(),
                config: RunConfig {
                    nthreads: 1,
                    ngpus: 1,
                    minimum_bytes: 8,
                    maximum_bytes: 1 << 60,
                    step_factor: Some(2),
                    step_bytes: None,
                    warmup_iters: 5,
                    iterations: 20,
                    aggregated_iterations: 1,
                    validation: 1,
                    blocking_collectives: false,
                    per_iter_timing: false,
                    registered_buffers: true,
                    nranks: 2,
                },
                devices: vec![Device {
                    rank: 0,
                    group: 0,
                    pid: 42,
                    hostname: "h\r\u{c}\u{8}".into(),
                    device: "cpu".into(),
                    device_info: "😀".into(),
                }],
                results: vec![Row {
                    size: (1 << 53) + 1,
                    count: 1 << 51,
                    dtype: "float".into(),
                    redop: "sum".into(),
                    root: -1,
                    out_of_place: t,
                    in_place: Timing { time: Time::Wall(None), alg_bw: None, bus_bw: None, nwrong: None },
                    actual_iterations: 20,
                    experiment_name: String::new(),
                }],
                out_of_bounds: OutOfBounds { count: 0, okay: true },
                average_bus_bandwidth: AverageBusBandwidth { bandwidth: None, okay: "unchecked".into() },
                errors: vec![],
            }
        }

        #[test]
        fn the_file_is_nccl_tests_layout_with_null_for_what_is_not_finite() {
            assert_eq!(
                sample().to_json(),
                concat!(
                    r#"{"label":"oxccl P=2","library":"oxccl 0.1.0","benchmark":"all_reduce_perf","#,
                    r#""config":{"nthreads":1,"ngpus":1,"minimum_bytes":8,"maximum_bytes":1152921504606846976,"step_factor":2,"#,
                    r#""warmup_iters":5,"iterations":20,"aggregated_iterations":1,"validation":1,"blocking_collectives":false,"#,
                    r#""per_iter_timing":false,"registered_buffers":true,"nranks":2},"#,
                    r#""devices":[{"rank":0,"group":0,"pid":42,"hostname":"h\r\f\b","device":"cpu","device_info":"😀"}],"#,
                    r#""results":[{"size":9007199254740993,"count":2251799813685248,"type":"float","redop":"sum","root":-1,"#,
                    r#""out_of_place":{"time":12.5,"alg_bw":0.5,"bus_bw":0.75,"nwrong":0},"#,
                    r#""in_place":{"time":null,"alg_bw":null,"bus_bw":null,"nwrong":null},"#,
                    r#""actual_iterations":20,"experiment_name":""}],"#,
                    r#""out_of_bounds":{"count":0,"okay":true},"average_bus_bandwidth":{"bandwidth":null,"okay":"unchecked"},"errors":[]}"#
                )
            );
            let mut cpu = sample();
            cpu.results[0].out_of_place.time = Time::Cpu(Some(3.0));
            assert!(cpu.to_json().contains(r#""out_of_place":{"cpu_time":3.0,"alg_bw""#));
            assert_eq!(json::parse::<Results>(&cpu.to_json()).unwrap(), cpu);
        }

        #[test]
        fn malformed_results_are_refused_with_the_place() {
            let text = sample().to_json().replace(r#""count":0,"#, r#""count":+0,"#);
            let at = text.find('+').unwrap() + 1;
            assert_eq!(
                json::parse::<Results>(&text).unwrap_err(),
                format!("expected value at line 1 column {at}")
            );
            let text = sample().to_json();
            let cut = &text[..text.len() / 2];
            assert!(json::parse::<Results>(cut)
                .unwrap_err()
                .contains(&format!(" at line 1 column {}", cut.chars().count())));
        }
    }
}
