//! `--plot`: bus bandwidth and time against size, on log axes, one line per result set, as
//! an SVG written by hand (no dependencies); [`read`] takes the lines from results files,
//! refusing a file that is not JSON with its path and the place.

use oxccl_core::json;
use serde::Deserialize;
use std::fmt::Write as _;

/// One line of the plot: a label and (size bytes, busbw GB/s, time µs) points.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64, f64)>,
}

/// What `--plot` reads of a results file: oxccl-perf's [`crate::report::Results`], nccl-tests'
/// `-J` files, and the bench scripts' summaries (label and results only). Other keys are
/// ignored; a missing or `null` number leaves the row out.
#[derive(Deserialize)]
struct PlotFile {
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    results: Vec<PlotRow>,
}

#[derive(Deserialize)]
struct PlotRow {
    #[serde(default, rename = "type")]
    dtype: Option<String>,
    #[serde(default)]
    redop: Option<String>,
    #[serde(default)]
    root: Option<Num>,
    #[serde(default)]
    size: Option<Num>,
    #[serde(default)]
    out_of_place: Option<PlotTiming>,
}

#[derive(Deserialize)]
struct PlotTiming {
    #[serde(default)]
    time: Option<Num>,
    #[serde(default)]
    bus_bw: Option<Num>,
}

/// A number, or a number written as a string (as some tools write theirs).
#[derive(Deserialize)]
#[serde(untagged)]
enum Num {
    Number(f64),
    Text(String),
}

impl Num {
    fn get(n: &Option<Num>) -> Option<f64> {
        match n.as_ref()? {
            Num::Number(x) => Some(*x),
            Num::Text(t) => t.trim().parse().ok(),
        }
    }
}

/// Reads a results file (oxccl-perf's or nccl-tests' `-J` JSON) into one series per
/// benchmark/type/op found in it, using out-of-place numbers. The error names the file and
/// says what was wrong and where.
pub fn read(path: &str) -> Result<Vec<Series>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let j: PlotFile = json::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    let label = j
        .label
        .unwrap_or_else(|| path.rsplit('/').next().unwrap_or(path).trim_end_matches(".json").to_string());
    let mut out: Vec<Series> = Vec::new();
    for r in &j.results {
        let key = format!(
            "{} {} {}",
            r.dtype.as_deref().unwrap_or(""),
            r.redop.as_deref().unwrap_or(""),
            Num::get(&r.root).map(|x| x.to_string()).unwrap_or_default()
        );
        let (Some(size), Some(oop)) = (Num::get(&r.size), &r.out_of_place) else {
            continue;
        };
        let (Some(t), Some(bw)) = (Num::get(&oop.time), Num::get(&oop.bus_bw)) else {
            continue;
        };
        match out.iter_mut().find(|s| s.label.ends_with(&key)) {
            Some(s) => s.points.push((size, bw, t)),
            None => out.push(Series { label: format!("{label} {key}"), points: vec![(size, bw, t)] }),
        }
    }
    // One series per file reads best with just the file's label.
    if out.len() == 1 {
        out[0].label = label;
    }
    Ok(out)
}

fn size_label(b: f64) -> String {
    let b = b as u64;
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

const COLORS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

fn log_range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let (a, b) = (lo.log10().floor(), hi.log10().ceil());
    (a, if b <= a { a + 1.0 } else { b })
}

/// Where a panel goes.
struct Frame {
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
}

/// The value a panel plots: bus bandwidth or time.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Y {
    BusBw,
    Time,
}

fn y_of(p: &(f64, f64, f64), y: Y) -> f64 {
    if y == Y::BusBw {
        p.1
    } else {
        p.2
    }
}

/// One panel, log2 sizes across, log10 values up.
fn panel(svg: &mut String, series: &[Series], f: &Frame, y: Y, title: &str, unit: &str) {
    let Frame { x0, y0, w, h } = *f;
    let xs: Vec<f64> =
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(|v| *v > 0.0).collect();
    // No point to place (files without plottable rows): an empty 1..2 byte axis, where the
    // folds below would make an infinite range and the tick loop never end.
    let (xmin, xmax) = if xs.is_empty() {
        (0.0, 1.0)
    } else {
        let xmin = xs.iter().cloned().fold(f64::INFINITY, f64::min).max(1.0).log2().floor();
        (xmin, xs.iter().cloned().fold(1.0f64, f64::max).log2().ceil().max(xmin + 1.0))
    };
    let (ya, yb) = log_range(series.iter().flat_map(|s| s.points.iter().map(move |p| y_of(p, y))));
    let px = |v: f64| x0 + (v.max(1.0).log2() - xmin) / (xmax - xmin) * w;
    let py = |v: f64| y0 + h - (v.max(1e-12).log10() - ya) / (yb - ya) * h;
    let _ =
        writeln!(svg, r#"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="white" stroke="black"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{title}</text>"#,
        x0 + w / 2.0,
        y0 - 8.0
    );
    let step = ((xmax - xmin) / 10.0).ceil().max(1.0);
    let mut e = xmin;
    while e <= xmax {
        let x = x0 + (e - xmin) / (xmax - xmin) * w;
        let _ = writeln!(svg, r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{}" stroke="#ddd"/>"##, y0 + h);
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{}" font-size="10" text-anchor="middle">{}</text>"#,
            y0 + h + 14.0,
            size_label(2f64.powf(e))
        );
        e += step;
    }
    let mut d = ya;
    while d <= yb {
        let yy = y0 + h - (d - ya) / (yb - ya) * h;
        let _ = writeln!(svg, r##"<line x1="{x0}" y1="{yy}" x2="{}" y2="{yy}" stroke="#ddd"/>"##, x0 + w);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{}</text>"#,
            x0 - 4.0,
            yy + 3.0,
            10f64.powf(d)
        );
        d += 1.0;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">size (bytes)</text>"#,
        x0 + w / 2.0,
        y0 + h + 30.0
    );
    let (lx, ly) = (x0 - 40.0, y0 + h / 2.0);
    let _ = writeln!(
        svg,
        r#"<text x="{lx}" y="{ly}" font-size="11" text-anchor="middle" transform="rotate(-90 {lx} {ly})">{unit}</text>"#
    );
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|p| (p.0, y_of(p, y)))
            .filter(|(_, v)| *v > 0.0)
            .map(|(x, v)| (px(x), py(v)))
            .collect();
        let line: Vec<String> = pts.iter().map(|(x, v)| format!("{x:.1},{v:.1}")).collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            line.join(" ")
        );
        for (x, v) in &pts {
            let _ = writeln!(svg, r#"<circle cx="{x:.1}" cy="{v:.1}" r="2.5" fill="{c}"/>"#);
        }
    }
}

/// Renders the series as an SVG document.
pub fn svg(series: &[Series], title: &str) -> String {
    let (w, h) = (1100.0, 470.0 + 18.0 * series.len() as f64);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="16" text-anchor="middle">{}</text>"#,
        w / 2.0,
        xml(title)
    );
    panel(
        &mut s,
        series,
        &Frame { x0: 80.0, y0: 60.0, w: 440.0, h: 320.0 },
        Y::BusBw,
        "bus bandwidth",
        "busbw (GB/s)",
    );
    panel(&mut s, series, &Frame { x0: 620.0, y0: 60.0, w: 440.0, h: 320.0 }, Y::Time, "time", "time (µs)");
    for (i, se) in series.iter().enumerate() {
        let y = 430.0 + 18.0 * i as f64;
        let c = COLORS[i % COLORS.len()];
        let _ = writeln!(s, r#"<rect x="80" y="{}" width="14" height="4" fill="{c}"/>"#, y - 4.0);
        let _ = writeln!(s, r#"<text x="100" y="{y}" font-size="12">{}</text>"#, xml(&se.label));
    }
    s.push_str("</svg>\n");
    s
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series() {
        let a = Series {
            label: "oxccl".into(),
            points: vec![(8.0, 0.01, 1.0), (1024.0, 1.0, 2.0), (1048576.0, 10.0, 100.0)],
        };
        let b = Series { label: "peer <x>".into(), points: vec![(8.0, 0.02, 0.5), (1048576.0, 5.0, 200.0)] };
        let out = svg(&[a, b], "all_reduce");
        assert!(out.starts_with("<svg") && out.trim_end().ends_with("</svg>"));
        assert_eq!(out.matches("<polyline").count(), 4);
        assert!(out.contains("peer &lt;x&gt;") && out.contains(">8<") && out.contains(">512K<"));
    }

    #[test]
    fn no_points_make_an_empty_plot() {
        let s = svg(&[], "nothing");
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"), "{s}");
        let zero = Series { label: "zero".into(), points: vec![(0.0, 0.0, 0.0)] };
        assert!(svg(&[zero], "zeros").trim_end().ends_with("</svg>"));
    }

    mod reading {
        use super::*;
        use crate::report::tests::strategies::{measured, text};
        use proptest::prelude::*;

        use oxccl_testkit::scope::Scratch;

        /// Writes `text` to `name` in `dir`; its path.
        fn scratch(dir: &Scratch, name: &str, text: &str) -> String {
            let path = dir.join(name).to_str().unwrap().to_string();
            std::fs::write(&path, text).unwrap();
            path
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn a_results_file_reads_back_as_its_points(
                label in text(), rows in prop::collection::vec((0u64..1 << 60, measured(), measured()), 1..6),
            ) {
                let body = |t: Option<f64>, bw: Option<f64>| serde_json::json!({"time": t, "bus_bw": bw});
                let results: Vec<_> = rows
                    .iter()
                    .map(|(size, t, bw)| serde_json::json!({"size": size, "type": "float", "redop": "sum", "root": -1, "out_of_place": body(*t, *bw)}))
                    .collect();
                let dir = Scratch::new("oxccl-plot-test");
                let path = scratch(&dir, "prop.json", &serde_json::json!({"label": label, "results": results}).to_string());
                let s = read(&path).unwrap();
                let want: Vec<(f64, f64, f64)> = rows
                    .iter()
                    .filter_map(|(size, t, bw)| Some((*size as f64, (*bw)?, (*t)?)))
                    .collect();
                if want.is_empty() {
                    prop_assert!(s.is_empty());
                } else {
                    prop_assert_eq!(s.len(), 1);
                    prop_assert_eq!(&s[0].label, &label);
                    prop_assert_eq!(&s[0].points, &want);
                }
            }
        }

        #[test]
        fn numbers_as_text_and_nulls_are_read_and_malformed_files_named() {
            let dir = Scratch::new("oxccl-plot-test");
            let path = scratch(
                &dir,
                "mixed.json",
                r#"{"results": [{"size": "1024", "type": "float", "redop": "sum", "root": 0,
                                 "out_of_place": {"time": " 2.5", "bus_bw": 1e1}},
                                {"size": 2048, "out_of_place": {"time": null, "bus_bw": 3}},
                                {"size": 4096, "out_of_place": {"time": 7, "bus_bw": 8}}]}"#,
            );
            let s = read(&path).unwrap();
            assert_eq!(s.len(), 2);
            assert_eq!(
                (s[0].label.as_str(), s[0].points.as_slice()),
                (
                    format!("{} float sum 0", path.trim_end_matches(".json").rsplit('/').next().unwrap())
                        .as_str(),
                    &[(1024.0, 10.0, 2.5)][..]
                )
            );
            assert_eq!(s[1].points, [(4096.0, 8.0, 7.0)]);
            let bad = scratch(&dir, "bad.json", "{\"label\": \"x\",\n \"results\": [{\"size\": +1}]}");
            assert_eq!(read(&bad).unwrap_err(), format!("{bad}: expected value at line 2 column 23"));
            let cut = scratch(&dir, "cut.json", "{\"label\": \"x\",\n \"results\": [{\"size\": 1");
            assert_eq!(
                read(&cut).unwrap_err(),
                format!("{cut}: EOF while parsing an object at line 2 column 23")
            );
            let weird = scratch(&dir, "weird.json", "{\"results\": [{\"size\": true}]}");
            assert_eq!(
                read(&weird).unwrap_err(),
                format!("{weird}: data did not match any variant of untagged enum Num at line 1 column 27")
            );
        }
    }
}
