//! Communication graphs over a topology: rings (near devices adjacent, one per channel) and
//! NCCL-style double binary trees over hosts (two complementary trees, each node an interior
//! vertex of at most one), with a chain through the ranks of each host.

use super::{HostTopo, PathType};

/// A binary tree over `0..n`: `parent[i]` (`None` at the root) and up to two children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    pub parent: Vec<Option<usize>>,
    pub children: Vec<Vec<usize>>,
}

impl Tree {
    pub fn root(&self) -> usize {
        self.parent.iter().position(|p| p.is_none()).unwrap_or(0)
    }

    /// Levels below the root of the deepest vertex.
    pub fn depth(&self) -> usize {
        (0..self.parent.len())
            .map(|mut v| {
                let mut d = 0;
                while let Some(p) = self.parent[v] {
                    v = p;
                    d += 1;
                }
                d
            })
            .max()
            .unwrap_or(0)
    }

    pub fn is_interior(&self, v: usize) -> bool {
        !self.children[v].is_empty()
    }

    fn from_parents(parent: Vec<Option<usize>>) -> Tree {
        let mut children = vec![Vec::new(); parent.len()];
        for (v, p) in parent.iter().enumerate() {
            if let Some(p) = p {
                children[*p].push(v);
            }
        }
        Tree { parent, children }
    }
}

/// The in-order binary tree over `0..n`: vertex `i` is `x = i + 1`; with `b` the lowest set bit
/// of `x`, its children are `x ∓ b/2` and its parent `x ± b`. Every even `i` is a leaf and
/// every odd `i` (that has a child within range) is interior.
pub fn btree(n: usize) -> Tree {
    let parent_of = |x: usize| -> usize {
        let b = x & x.wrapping_neg();
        if x & (b << 1) != 0 {
            x - b
        } else {
            x + b
        }
    };
    let root = if n == 0 { 0 } else { 1usize << (usize::BITS - 1 - n.leading_zeros()) };
    let parent = (1..=n)
        .map(|x| {
            if x == root {
                return None;
            }
            let mut p = parent_of(x);
            while p > n {
                p = parent_of(p);
            }
            Some(p - 1)
        })
        .collect();
    Tree::from_parents(parent)
}

/// The two complementary trees over `0..n`: the in-order tree, and its mirror (`n` even) or
/// its shift by one (`n` odd), so no vertex is interior in both.
pub fn double_btree(n: usize) -> [Tree; 2] {
    let t0 = btree(n);
    let map = |i: usize| if n % 2 == 0 { n - 1 - i } else { (i + 1) % n };
    let mut parent = vec![None; n];
    for i in 0..n {
        if let Some(p) = t0.parent[i] {
            parent[map(i)] = Some(map(p));
        }
    }
    [t0, Tree::from_parents(parent)]
}

/// The order in which a ring visits a host's GPUs: from the first, always to the nearest
/// unvisited one (nearest path type, then widest path, then lowest device index).
pub fn ring_order(h: &HostTopo) -> Vec<usize> {
    let gpus = h.gpus();
    let Some(&first) = gpus.first() else { return Vec::new() };
    let mut order = vec![first];
    while order.len() < gpus.len() {
        let at = *order.last().unwrap_or(&first);
        let next = gpus
            .iter()
            .filter(|g| !order.contains(g))
            .min_by(|&&a, &&b| {
                let pa = h.path(at, a).map(|p| (p.kind, -p.gbs)).unwrap_or((PathType::Net, 0.0));
                let pb = h.path(at, b).map(|p| (p.kind, -p.gbs)).unwrap_or((PathType::Net, 0.0));
                pa.partial_cmp(&pb).unwrap_or(std::cmp::Ordering::Equal)
            })
            .copied()
            .unwrap_or(first);
        order.push(next);
    }
    order
}

/// The worst hop of a ring through `order` (closing hop included): (type, narrowest GB/s).
pub fn ring_bottleneck(h: &HostTopo, order: &[usize]) -> (PathType, f64) {
    let mut worst = (PathType::Loc, f64::INFINITY);
    for i in 0..order.len() {
        let (a, b) = (order[i], order[(i + 1) % order.len()]);
        if a == b {
            continue;
        }
        if let Some(p) = h.path(a, b) {
            worst.0 = worst.0.max(p.kind);
            worst.1 = worst.1.min(p.gbs);
        }
    }
    worst
}

/// The rings and trees `oxccl topo` prints: per channel, the ring through every GPU (hosts in
/// order, each host's GPUs in [`ring_order`] rotated by channel so channels enter each host at
/// different GPUs), then the two trees over hosts with the chain inside each host.
pub fn describe(t: &super::Topo, nchannels: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let per_host: Vec<Vec<u32>> = t
        .hosts
        .iter()
        .map(|h| ring_order(h).into_iter().map(|g| h.nodes[g].dev.unwrap_or(0)).collect())
        .collect();
    let gpus: usize = per_host.iter().map(Vec::len).sum();
    if gpus == 0 {
        out.push_str("no GPUs: CPU ranks form rings in host order, ranks of a host adjacent\n");
        return out;
    }
    let mut first_rank = Vec::new();
    let mut r = 0;
    for h in &per_host {
        first_rank.push(r);
        r += h.len();
    }
    for c in 0..nchannels.max(1) {
        let mut ring = Vec::new();
        for (hi, order) in per_host.iter().enumerate() {
            let l = order.len().max(1);
            let shift = (2 * c) % l;
            for k in 0..order.len() {
                let dev = order[(k + shift) % l];
                ring.push(first_rank[hi] + dev as usize);
            }
        }
        let shown: Vec<String> = ring.iter().take(32).map(|r| r.to_string()).collect();
        let more = if ring.len() > 32 { format!(" … ({} ranks)", ring.len()) } else { String::new() };
        let _ = writeln!(out, "channel {c} ring: {}{more}", shown.join(" → "));
    }
    let n = t.hosts.len();
    let trees = double_btree(n);
    for (i, tree) in trees.iter().enumerate() {
        let _ = write!(out, "tree {i} over {n} host(s): root host {}, depth {}", tree.root(), tree.depth());
        let edges: Vec<String> = (0..n)
            .filter(|&v| tree.is_interior(v))
            .take(16)
            .map(|v| format!("{v}→{:?}", tree.children[v]))
            .collect();
        if !edges.is_empty() {
            let _ = write!(out, "; children: {}", edges.join(" "));
        }
        out.push('\n');
    }
    if let Some(order) = per_host.first().filter(|o| o.len() > 1) {
        let chain: Vec<String> = order.iter().map(|d| format!("GPU{d}")).collect();
        let _ = writeln!(out, "chain inside each host: {}", chain.join(" → "));
    }
    out
}

/// One host drawn as SVG: CPUs on top, PCIe switches below them, then GPUs and NICs, the
/// NVSwitch at the bottom; links coloured by kind and labelled with GB/s.
pub fn svg(h: &HostTopo) -> String {
    use super::{LinkKind, NodeKind};
    use std::fmt::Write as _;
    let rows = [
        vec![NodeKind::Cpu],
        vec![NodeKind::Pci],
        vec![NodeKind::Gpu, NodeKind::Nic],
        vec![NodeKind::NvSwitch],
    ];
    let mut pos = vec![(0.0f64, 0.0f64); h.nodes.len()];
    let mut width = 400.0f64;
    for (ri, kinds) in rows.iter().enumerate() {
        let members: Vec<usize> = (0..h.nodes.len()).filter(|&i| kinds.contains(&h.nodes[i].kind)).collect();
        width = width.max(members.len() as f64 * 110.0 + 40.0);
        for (k, &i) in members.iter().enumerate() {
            pos[i] = (60.0 + k as f64 * 110.0, 50.0 + ri as f64 * 120.0);
        }
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"520\" font-family=\"monospace\" font-size=\"11\">"
    );
    let _ = writeln!(s, "<text x=\"10\" y=\"16\">{}</text>", h.name);
    for l in &h.links {
        let ((x1, y1), (x2, y2)) = (pos[l.a], pos[l.b]);
        let color = match l.kind {
            LinkKind::NvLink => "#76b900",
            LinkKind::Pci => "#3070c0",
            LinkKind::Smp => "#c03030",
        };
        let _ = writeln!(
            s,
            "<line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" stroke=\"{color}\" stroke-width=\"2\"/>"
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{:.0}</text>",
            (x1 + x2) / 2.0 + 3.0,
            (y1 + y2) / 2.0,
            l.gbs
        );
    }
    for (i, n) in h.nodes.iter().enumerate() {
        let (x, y) = pos[i];
        let label = match n.kind {
            NodeKind::Gpu => format!("GPU{}", n.dev.unwrap_or(0)),
            NodeKind::Cpu => format!("CPU{}", n.numa.unwrap_or(0)),
            _ => n.id.clone(),
        };
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"90\" height=\"30\" rx=\"4\" fill=\"#f4f4f4\" stroke=\"#333\"/><text x=\"{}\" y=\"{}\">{label}</text>",
            x - 45.0,
            y - 15.0,
            x - 40.0,
            y + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_tree(t: &Tree, n: usize) {
        assert_eq!(t.parent.len(), n);
        assert_eq!(t.parent.iter().filter(|p| p.is_none()).count(), usize::from(n > 0));
        for v in 0..n {
            assert!(t.children[v].len() <= 2, "n={n} vertex {v} has {:?}", t.children[v]);
            // Every vertex reaches the root without a cycle.
            let (mut x, mut steps) = (v, 0);
            while let Some(p) = t.parent[x] {
                x = p;
                steps += 1;
                assert!(steps <= n, "n={n}: cycle through {v}");
            }
            assert_eq!(x, t.root());
        }
    }

    #[test]
    fn double_binary_trees_span_every_vertex_and_share_no_interior_vertex() {
        for n in 1..=130 {
            let [a, b] = double_btree(n);
            check_tree(&a, n);
            check_tree(&b, n);
            for v in 0..n {
                assert!(!(a.is_interior(v) && b.is_interior(v)), "n={n}: {v} interior in both");
            }
            // Logarithmic depth.
            let bound = usize::BITS as usize - n.leading_zeros() as usize;
            assert!(
                a.depth() <= bound && b.depth() <= bound + 1,
                "n={n}: depths {} {}",
                a.depth(),
                b.depth()
            );
        }
        let t = btree(7);
        assert_eq!(t.root(), 3);
        assert_eq!(t.children[3], vec![1, 5]);
        assert_eq!(t.parent[0], Some(1));
        assert_eq!(t.parent[6], Some(5));
    }
}
