//! `NCCL_ALGO` and `NCCL_PROTO`: which algorithms and protocols each collective may use,
//! parsed with NCCL's syntax; an unknown name is an error naming the variable and the name.

use super::algo::Algo;
use crate::coll::RingColl;
use crate::proto::Proto;

/// NCCL's algorithm names that exist in NCCL but not here (accepted, never enabled).
const FOREIGN_ALGOS: [&str; 6] = ["collnetdirect", "collnetchain", "collnet", "nvls", "nvlstree", "pat"];

/// Which algorithms and protocols each collective may use: `NCCL_ALGO` and `NCCL_PROTO`, with
/// NCCL's syntax — a comma list, `^` for "all but", and `coll:list` parts separated by `;`
/// (`"ring;allreduce:tree,ring"`, `"^LL128"`, `"LL,Simple;allreduce:^LL"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enabled {
    pub algo: [[bool; 4]; 5],
    pub proto: [[bool; 3]; 5],
    /// The settings as given, for messages.
    pub algo_env: Option<String>,
    pub proto_env: Option<String>,
}

impl Default for Enabled {
    fn default() -> Self {
        Enabled { algo: [[true; 4]; 5], proto: [[true; 3]; 5], algo_env: None, proto_env: None }
    }
}

fn parse_list<const K: usize>(
    var: &str,
    text: &str,
    names: &[&str; K],
    foreign: &[&str],
) -> Result<[[bool; K]; 5], String> {
    let mut out = [[true; K]; 5];
    for (i, part) in text.split(';').map(str::trim).filter(|p| !p.is_empty()).enumerate() {
        let (colls, list) = match part.split_once(':') {
            Some((c, l)) => {
                let c = RingColl::parse(c.trim()).ok_or(format!(
                    "{var}={text}: unknown collective {:?} (broadcast, reduce, allgather, reducescatter, allreduce)",
                    c.trim()
                ))?;
                (vec![c], l)
            }
            None if i == 0 => (RingColl::ALL.to_vec(), part),
            None => {
                return Err(format!("{var}={text}: only the first part may omit \"collective:\" ({part:?})"))
            }
        };
        let (negate, list) = match list.trim().strip_prefix('^') {
            Some(l) => (true, l),
            None => (false, list),
        };
        let mut set = [negate; K];
        for tok in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match names.iter().position(|n| n.eq_ignore_ascii_case(tok)) {
                Some(k) => set[k] = !negate,
                None if foreign.iter().any(|f| f.eq_ignore_ascii_case(tok)) => {}
                None => {
                    return Err(format!("{var}={text}: unknown name {tok:?} (known: {})", names.join(", ")))
                }
            }
        }
        for c in colls {
            out[c as usize] = set;
        }
    }
    Ok(out)
}

impl Enabled {
    /// Parses `NCCL_ALGO` and `NCCL_PROTO` (either may be unset).
    pub fn parse(algo: Option<&str>, proto: Option<&str>) -> Result<Enabled, String> {
        let mut e = Enabled::default();
        if let Some(a) = algo {
            e.algo = parse_list("NCCL_ALGO", a, &["tree", "ring", "direct", "hier"], &FOREIGN_ALGOS)?;
            e.algo_env = Some(a.to_string());
        }
        if let Some(p) = proto {
            e.proto = parse_list("NCCL_PROTO", p, &["ll", "ll128", "simple"], &[])?;
            e.proto_env = Some(p.to_string());
        }
        Ok(e)
    }

    /// The settings as given (`NCCL_ALGO=… NCCL_PROTO=…`), for messages.
    pub fn describe(&self) -> String {
        [
            self.algo_env.as_ref().map(|a| format!("NCCL_ALGO={a}")),
            self.proto_env.as_ref().map(|p| format!("NCCL_PROTO={p}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ")
    }

    pub fn allows(&self, c: RingColl, a: Algo, p: Proto) -> bool {
        self.algo[c as usize][a as usize] && self.proto[c as usize][p as usize]
    }
}
