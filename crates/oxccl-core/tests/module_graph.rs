//! The file-level module graph of oxccl-core and oxccl-capi has no cycle (no two files name
//! each other, directly or through others), and the graph is read as it must be.
//!
//! A node is a source file. An edge A → B says that A's code names an item of B: a path that
//! starts at `crate::`, `$crate::`, `super::`, `self::`, a child module, or a name A imports,
//! in a `use` tree or in code. A name that a module imports (`use`, `pub use`, globs too) is
//! followed to the file that defines it, so a re-export (the crate root's, a `mod.rs`'s) is no
//! hub. A `mod x;` declaration is no edge: it places x, it names nothing of it. Test code
//! (`#[cfg(test)]` items, inline or files) is left out: no other code can name it, so it closes
//! no cycle. Comments, strings and attributes are not read. A cycle fails the test, named file
//! by file with the line and path that make each edge.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
    /// `::`
    Sep,
    /// A literal: string, char or number.
    Lit,
}

/// The tokens of a Rust source, each with its line; comments dropped, literals opaque.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    // Skips a quoted literal whose opening quote is at `i`; returns the index after it.
    let quoted = |mut i: usize, q: char, line: &mut usize| {
        i += 1;
        while i < c.len() && c[i] != q {
            if c[i] == '\\' {
                i += 1;
            }
            if at(i) == '\n' {
                *line += 1;
            }
            i += 1;
        }
        i + 1
    };
    while i < c.len() {
        let ch = c[i];
        let start = line;
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string(&c, i) {
            line += c[i..end].iter().filter(|&&x| x == '\n').count();
            out.push((Tok::Lit, start));
            i = end;
        } else if ch == '"' || (ch == 'b' && at(i + 1) == '"') {
            i = quoted(if ch == 'b' { i + 1 } else { i }, '"', &mut line);
            out.push((Tok::Lit, start));
        } else if ch == '\'' || (ch == 'b' && at(i + 1) == '\'') {
            let q = if ch == 'b' { i + 1 } else { i };
            if at(q + 1) == '\\' || at(q + 2) == '\'' {
                i = quoted(q, '\'', &mut line);
                out.push((Tok::Lit, start));
            } else {
                // A lifetime or label: the quote and its name.
                i = q + 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic()
            || ch == '_'
            || (ch == '$' && c[i + 1..].starts_with(&['c', 'r', 'a', 't', 'e']))
        {
            // `$crate` reads as `crate`; `r#name` as `name`.
            let mut j = if ch == '$' || (ch == 'r' && at(i + 1) == '#') { i + 1 } else { i };
            j += usize::from(at(j) == '#');
            let s = j;
            while at(j).is_alphanumeric() || at(j) == '_' {
                j += 1;
            }
            out.push((Tok::Ident(c[s..j].iter().collect()), start));
            i = j;
        } else if ch.is_ascii_digit() {
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            out.push((Tok::Lit, start));
        } else if ch == ':' && at(i + 1) == ':' {
            out.push((Tok::Sep, start));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), start));
            i += 1;
        }
    }
    out
}

/// The end of a raw string (`r"…"`, `r#"…"#`, `br"…"`) that starts at `i`, if one does.
fn raw_string(c: &[char], i: usize) -> Option<usize> {
    let mut j = i + usize::from(c[i] == 'b');
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&x| x == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

/// One name a `use` tree brings in: its path as written, and the name (None for a glob).
#[derive(Clone, Debug)]
struct Import {
    path: Vec<String>,
    name: Option<String>,
    line: usize,
}

#[derive(Debug, Default)]
struct Module {
    file: usize,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Where the files of its `mod x;` children are.
    dir: PathBuf,
    imports: Vec<Import>,
    /// Paths in code: (segments, line).
    paths: Vec<(Vec<String>, usize)>,
    /// The names of the items it defines (`fn`, `struct`, … `macro_rules!`).
    defines: BTreeSet<String>,
}

/// A crate's modules and files, read from its roots through `mod` declarations.
struct Graph {
    files: Vec<String>,
    modules: Vec<Module>,
}

/// The index of the token that closes the bracket opened at `open`.
fn closing(t: &[(Tok, usize)], open: usize) -> usize {
    let (o, c) = match t[open].0 {
        Tok::Punct('(') => ('(', ')'),
        Tok::Punct('[') => ('[', ']'),
        _ => ('{', '}'),
    };
    let mut depth = 0;
    for (k, (tok, _)) in t.iter().enumerate().skip(open) {
        if *tok == Tok::Punct(o) {
            depth += 1;
        } else if *tok == Tok::Punct(c) {
            depth -= 1;
            if depth == 0 {
                return k;
            }
        }
    }
    t.len()
}

/// Whether an attribute's tokens (inside `#[…]`) are `cfg(test)` or `cfg(all(…, test, …))`.
fn test_only(a: &[(Tok, usize)]) -> bool {
    let ident = |k: usize, s: &str| matches!(a.get(k), Some((Tok::Ident(x), _)) if x == s);
    if !ident(0, "cfg") {
        return false;
    }
    if ident(2, "test") && a.len() == 4 {
        return true;
    }
    if !ident(2, "all") {
        return false;
    }
    // The arguments of `all(…)`, split at top-level commas.
    let (mut depth, mut arg) = (0, Vec::new());
    for (tok, _) in &a[4..a.len().saturating_sub(2)] {
        match tok {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => depth -= 1,
            Tok::Punct(',') if depth == 0 => {
                if arg == [Tok::Ident("test".into())] {
                    return true;
                }
                arg.clear();
                continue;
            }
            _ => {}
        }
        arg.push(tok.clone());
    }
    arg == [Tok::Ident("test".into())]
}

/// The end of the item that starts at `i`: after its `;` or its closing `}`.
fn item_end(t: &[(Tok, usize)], mut i: usize, end: usize) -> usize {
    while i < end {
        match t[i].0 {
            Tok::Punct(';') => return i + 1,
            Tok::Punct('{') => return closing(t, i) + 1,
            Tok::Punct('(') | Tok::Punct('[') => i = closing(t, i) + 1,
            _ => i += 1,
        }
    }
    end
}

/// Reads a `use` tree at `j` under `prefix` into `out`; returns the index after it.
fn use_tree(t: &[(Tok, usize)], mut j: usize, prefix: Vec<String>, out: &mut Vec<Import>) -> usize {
    let mut path = prefix;
    let line = t.get(j).map_or(0, |x| x.1);
    loop {
        match t.get(j).map(|x| &x.0) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                j += 1;
                if t.get(j).map(|x| &x.0) == Some(&Tok::Sep) {
                    j += 1;
                    continue;
                }
                let mut name = path.last().cloned();
                if path.last().is_some_and(|l| l == "self") {
                    path.pop();
                    name = path.last().cloned();
                }
                if matches!(t.get(j), Some((Tok::Ident(a), _)) if a == "as") {
                    name = match t.get(j + 1) {
                        Some((Tok::Ident(n), _)) => Some(n.clone()),
                        _ => None,
                    };
                    j += 2;
                }
                out.push(Import { path, name, line });
                return j;
            }
            Some(Tok::Punct('*')) => {
                out.push(Import { path, name: None, line });
                return j + 1;
            }
            Some(Tok::Punct('{')) => {
                j += 1;
                while j < t.len() && t[j].0 != Tok::Punct('}') {
                    j = use_tree(t, j, path.clone(), out);
                    if t.get(j).map(|x| &x.0) == Some(&Tok::Punct(',')) {
                        j += 1;
                    }
                }
                return j + 1;
            }
            _ => return j + 1,
        }
    }
}

/// Reads a source file: the disk, or a test's files in memory.
type Reader<'a> = &'a dyn Fn(&Path) -> Option<String>;

const ITEM_KEYWORDS: &[&str] = &["fn", "struct", "enum", "union", "trait", "type", "const", "static"];

impl Graph {
    /// Reads the crate whose root files are `roots` (relative to `src`), through `read`.
    fn load(src: &Path, roots: &[&str], read: Reader) -> Graph {
        let mut g = Graph { files: Vec::new(), modules: Vec::new() };
        for r in roots {
            let path = src.join(r);
            let text = read(&path).unwrap_or_else(|| panic!("{}: cannot read", path.display()));
            g.file(read, src, &path, &text, None, String::new(), src.to_path_buf());
        }
        g
    }

    /// Adds the module of the file at `path` (a child `name` of `parent`, or a root).
    #[allow(clippy::too_many_arguments)]
    fn file(
        &mut self,
        read: Reader,
        src: &Path,
        path: &Path,
        text: &str,
        parent: Option<usize>,
        name: String,
        dir: PathBuf,
    ) {
        let rel = path.strip_prefix(src).unwrap_or(path).to_string_lossy().into_owned();
        let file = self.files.len();
        self.files.push(rel);
        let m = self.module(file, parent, name, dir);
        let t = tokens(text);
        let mut pending = Vec::new();
        self.scan(&t, 0, t.len(), m, &mut pending);
        for (m, name, line) in pending {
            self.child_file(read, src, m, &name, line);
        }
    }

    fn module(&mut self, file: usize, parent: Option<usize>, name: String, dir: PathBuf) -> usize {
        let id = self.modules.len();
        self.modules.push(Module { file, parent, dir, ..Module::default() });
        if let Some(p) = parent {
            self.modules[p].children.insert(name, id);
        }
        id
    }

    /// Loads the file of module `m`'s `mod name;` (`name.rs` or `name/mod.rs` in its dir).
    fn child_file(&mut self, read: Reader, src: &Path, m: usize, name: &str, line: usize) {
        let dir = self.modules[m].dir.clone();
        let candidates = [dir.join(format!("{name}.rs")), dir.join(name).join("mod.rs")];
        let found = candidates.iter().find_map(|p| read(p).map(|t| (p.clone(), t)));
        let Some((path, text)) = found else {
            panic!(
                "{}:{line}: `mod {name};` has no file in {}",
                self.files[self.modules[m].file],
                dir.display()
            )
        };
        self.file(read, src, &path, &text, Some(m), name.to_string(), dir.join(name));
    }

    /// Reads tokens `i..end` as the body of module `m`; `mod x;` children go to `pending`.
    fn scan(
        &mut self,
        t: &[(Tok, usize)],
        mut i: usize,
        end: usize,
        m: usize,
        pending: &mut Vec<(usize, String, usize)>,
    ) {
        let mut test_attr = false;
        let ident = |k: usize| match t.get(k) {
            Some((Tok::Ident(s), _)) if k < end => Some(s.as_str()),
            _ => None,
        };
        while i < end {
            let line = t[i].1;
            if t[i].0 == Tok::Punct('#') {
                let inner = t.get(i + 1).map(|x| &x.0) == Some(&Tok::Punct('!'));
                let open = i + 1 + usize::from(inner);
                if t.get(open).map(|x| &x.0) == Some(&Tok::Punct('[')) {
                    let close = closing(t, open);
                    if test_only(&t[open + 1..close]) {
                        // A module that is all test code (`#![cfg(test)]`) names nothing.
                        if inner {
                            return;
                        }
                        test_attr = true;
                    }
                    i = close + 1;
                    continue;
                }
            }
            if test_attr {
                test_attr = false;
                i = item_end(t, i, end);
                continue;
            }
            match ident(i) {
                Some("mod") if ident(i + 1).is_some() => {
                    let name = ident(i + 1).unwrap_or_default().to_string();
                    if t.get(i + 2).map(|x| &x.0) == Some(&Tok::Punct('{')) {
                        let close = closing(t, i + 2);
                        let dir = self.modules[m].dir.join(&name);
                        let child = self.module(self.modules[m].file, Some(m), name, dir);
                        self.scan(t, i + 3, close.min(end), child, pending);
                        i = close + 1;
                    } else {
                        pending.push((m, name, line));
                        i += 2;
                    }
                }
                Some("use") if t.get(i + 1).map(|x| &x.0) != Some(&Tok::Punct('<')) => {
                    let mut found = Vec::new();
                    // A leading `::` names another crate.
                    let j = if t.get(i + 1).map(|x| &x.0) == Some(&Tok::Sep) {
                        item_end(t, i, end)
                    } else {
                        use_tree(t, i + 1, Vec::new(), &mut found)
                    };
                    self.modules[m].imports.extend(found);
                    i = j;
                }
                Some("macro_rules") if t.get(i + 1).map(|x| &x.0) == Some(&Tok::Punct('!')) => {
                    if let Some(n) = ident(i + 2) {
                        self.modules[m].defines.insert(n.to_string());
                    }
                    i += 3;
                }
                Some(k) if ITEM_KEYWORDS.contains(&k) => {
                    if let Some(n) = ident(i + 1).filter(|n| !ITEM_KEYWORDS.contains(n)) {
                        self.modules[m].defines.insert(n.to_string());
                    }
                    i += 1;
                }
                Some(first)
                    if t.get(i + 1).map(|x| &x.0) == Some(&Tok::Sep)
                        && (i == 0 || t[i - 1].0 != Tok::Sep) =>
                {
                    let mut path = vec![first.to_string()];
                    let mut j = i + 1;
                    while t.get(j).map(|x| &x.0) == Some(&Tok::Sep) {
                        match ident(j + 1) {
                            Some(s) => path.push(s.to_string()),
                            None => break,
                        }
                        j += 2;
                    }
                    self.modules[m].paths.push((path, line));
                    i = j;
                }
                _ => i += 1,
            }
        }
    }

    /// The module and item name (if the path ends in an item) that `path`, written in module
    /// `m`, names; None when it names nothing of this crate (another crate, a local name).
    fn resolve(&self, m: usize, path: &[String], depth: usize) -> Option<(usize, Option<String>)> {
        if depth > 32 || path.is_empty() {
            return None;
        }
        let mods = &self.modules;
        let root = |mut x: usize| {
            while let Some(p) = mods[x].parent {
                x = p;
            }
            x
        };
        let (mut cur, mut k) = match path[0].as_str() {
            "crate" => (root(m), 1),
            "self" => (m, 1),
            "super" => {
                let mut cur = m;
                let mut k = 0;
                while path.get(k).is_some_and(|s| s == "super") {
                    cur = mods[cur].parent?;
                    k += 1;
                }
                (cur, k)
            }
            _ => (m, 0),
        };
        // A path that starts at a name of `m`: a child, or an import.
        if k == 0 && !mods[m].children.contains_key(&path[0]) {
            let imp = mods[m].imports.iter().find(|i| i.name.as_deref() == Some(path[0].as_str()))?;
            if imp.path.len() == 1 && imp.path[0] == path[0] {
                // `use name;` of a macro defined here.
                return Some((m, Some(path[0].clone())));
            }
            let mut p = imp.path.clone();
            p.extend_from_slice(&path[1..]);
            return self.resolve(m, &p, depth + 1);
        }
        while k < path.len() {
            let s = &path[k];
            if let Some(&c) = mods[cur].children.get(s) {
                cur = c;
                k += 1;
                continue;
            }
            if let Some(imp) = mods[cur].imports.iter().find(|i| i.name.as_deref() == Some(s.as_str())) {
                if !(imp.path.len() == 1 && &imp.path[0] == s) {
                    let mut p = imp.path.clone();
                    p.extend_from_slice(&path[k + 1..]);
                    return self.resolve(cur, &p, depth + 1);
                }
            } else if !mods[cur].defines.contains(s) {
                // Brought in by a glob, if one of its modules has it.
                for imp in mods[cur].imports.iter().filter(|i| i.name.is_none()) {
                    let Some((g, None)) = self.resolve(cur, &imp.path, depth + 1) else { continue };
                    let has = mods[g].children.contains_key(s)
                        || mods[g].defines.contains(s)
                        || mods[g].imports.iter().any(|i| i.name.as_deref() == Some(s.as_str()));
                    if has {
                        let mut p = imp.path.clone();
                        p.extend_from_slice(&path[k..]);
                        return self.resolve(cur, &p, depth + 1);
                    }
                }
            }
            return Some((cur, Some(s.clone())));
        }
        Some((cur, None))
    }

    /// Each file's edges: target file → (line, path as written) of the first reference.
    fn edges(&self) -> Vec<BTreeMap<usize, (usize, String)>> {
        let mut out = vec![BTreeMap::new(); self.files.len()];
        for (m, md) in self.modules.iter().enumerate() {
            let imports = md.imports.iter().map(|i| (&i.path, i.line, i.name.is_none()));
            let paths = md.paths.iter().map(|(p, l)| (p, *l, false));
            for (path, line, glob) in imports.chain(paths) {
                let Some((target, _)) = self.resolve(m, path, 0) else { continue };
                let to = self.modules[target].file;
                if to != md.file {
                    let text = path.join("::") + if glob { "::*" } else { "" };
                    out[md.file].entry(to).or_insert((line, text));
                }
            }
        }
        out
    }

    /// Each cycle (a strongly connected set of more than one file) as one line: the files of
    /// the set, then one cycle through them with each edge's line and path.
    fn cycles(&self) -> Vec<String> {
        let edges = self.edges();
        let n = self.files.len();
        // Kosaraju: finishing order on the graph, then sets on the reversed graph.
        let mut order = Vec::new();
        let mut seen = vec![false; n];
        for s in 0..n {
            if seen[s] {
                continue;
            }
            seen[s] = true;
            let mut stack = vec![(s, edges[s].keys().copied().collect::<Vec<_>>())];
            while let Some(top) = stack.last_mut() {
                if let Some(w) = top.1.pop() {
                    if !seen[w] {
                        seen[w] = true;
                        let ws = edges[w].keys().copied().collect();
                        stack.push((w, ws));
                    }
                } else {
                    order.push(top.0);
                    stack.pop();
                }
            }
        }
        let mut rev = vec![Vec::new(); n];
        for (a, es) in edges.iter().enumerate() {
            for &b in es.keys() {
                rev[b].push(a);
            }
        }
        let mut set_of = vec![usize::MAX; n];
        let mut sets: Vec<Vec<usize>> = Vec::new();
        for &s in order.iter().rev() {
            if set_of[s] != usize::MAX {
                continue;
            }
            let id = sets.len();
            let mut set = vec![s];
            set_of[s] = id;
            let mut k = 0;
            while k < set.len() {
                for &w in &rev[set[k]] {
                    if set_of[w] == usize::MAX {
                        set_of[w] = id;
                        set.push(w);
                    }
                }
                k += 1;
            }
            sets.push(set);
        }
        let mut out = Vec::new();
        for set in sets.iter().filter(|s| s.len() > 1) {
            let mut names: Vec<&str> = set.iter().map(|&f| self.files[f].as_str()).collect();
            names.sort();
            let start = *set.iter().min_by_key(|&&f| &self.files[f]).unwrap_or(&set[0]);
            // The shortest way back to `start` inside the set.
            let mut prev = vec![usize::MAX; n];
            let mut q = VecDeque::from([start]);
            'bfs: while let Some(v) = q.pop_front() {
                for &w in edges[v].keys().filter(|&&w| set_of[w] == set_of[start]) {
                    if prev[w] == usize::MAX {
                        prev[w] = v;
                        if w == start {
                            break 'bfs;
                        }
                        q.push_back(w);
                    }
                }
            }
            let mut way = vec![start];
            let mut v = prev[start];
            while v != start {
                way.push(v);
                v = prev[v];
            }
            way.push(start);
            way.reverse();
            let steps: Vec<String> = way
                .windows(2)
                .map(|w| {
                    let (line, path) = &edges[w[0]][&w[1]];
                    format!("{}:{line} `{path}`", self.files[w[0]])
                })
                .collect();
            out.push(format!("{{{}}}: {} → {}", names.join(", "), steps.join(" → "), self.files[start]));
        }
        out
    }
}

fn read_disk(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The graph of a workspace crate, from its roots under `src/`.
fn crate_graph(krate: &str, roots: &[&str]) -> Graph {
    Graph::load(&workspace().join(krate).join("src"), roots, &read_disk)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crates whose graphs must have no cycle, with their roots.
const ACYCLIC: &[(&str, &[&str])] = &[("crates/oxccl-core", &["lib.rs"]), ("crates/oxccl-capi", &["lib.rs"])];

#[test]
fn core_and_capi_have_no_module_cycle() {
    let mut found = Vec::new();
    for (krate, roots) in ACYCLIC {
        found.extend(crate_graph(krate, roots).cycles().into_iter().map(|c| format!("{krate}: {c}")));
    }
    assert!(
        found.is_empty(),
        "files that name each other in a circle (move what they share below them):\n{}",
        found.join("\n")
    );
}

/// Every source file of a checked crate is read (its test files aside), so a cycle cannot hide
/// in a file the graph missed; and the graph holds edges of each kind it reads.
#[test]
fn the_graph_reads_every_file_and_each_kind_of_reference() {
    for (krate, roots) in ACYCLIC {
        let src = workspace().join(krate).join("src");
        let g = crate_graph(krate, roots);
        let mut all = Vec::new();
        rust_files(&src, &mut all);
        let unread: Vec<String> = all
            .iter()
            .map(|p| p.strip_prefix(&src).unwrap_or(p).to_string_lossy().into_owned())
            .filter(|f| !g.files.contains(f) && !f.ends_with("tests.rs"))
            .collect();
        assert!(unread.is_empty(), "{krate}: files the graph did not reach: {unread:?}");
    }
    let g = crate_graph("crates/oxccl-core", &["lib.rs"]);
    let edges = g.edges();
    let edge = |a: &str, b: &str| {
        let (ia, ib) = (g.files.iter().position(|f| f == a), g.files.iter().position(|f| f == b));
        ia.zip(ib).is_some_and(|(ia, ib)| edges[ia].contains_key(&ib))
    };
    assert!(edge("plan/ring.rs", "coll.rs"), "`use crate::coll::RingColl`");
    assert!(edge("tuner/mod.rs", "topo/graphs.rs"), "`use crate::topo::graphs::{{…}}`");
    assert!(edge("plan/tree.rs", "tuning.rs"), "`crate::tuning::MAX_CHANNELS` in code");
    assert!(edge("netsim/engine.rs", "netsim/cluster.rs"), "`use super::cluster::Cluster`");
    // `crate::tuner::{Algo, Proto}` are `tuner`'s re-exports of `algo::Algo` and `proto::Proto`;
    // `crate::tuner::CpuCosts` is `tuner`'s own.
    assert!(edge("netsim/cluster.rs", "proto.rs") && edge("netsim/cluster.rs", "tuner/algo.rs"));
    assert!(edge("netsim/cluster.rs", "tuner/mod.rs"));
    assert!(!edge("plan/ring.rs", "plan/mod.rs"), "names `super::lane::…`, not the re-exports");
    assert!(!edge("lib.rs", "plan/mod.rs"), "`pub mod plan;` places, it names nothing");
    assert!(!edge("plan/det.rs", "plan/sim.rs"), "det.rs's tests are test code");
}

/// A small crate in memory: each way of naming a file makes its edge, re-exports are followed,
/// test code, comments and strings are not read, and a cycle is named with its lines.
#[test]
fn the_graph_follows_paths_imports_and_reexports() {
    let files: HashMap<&str, &str> = HashMap::from([
        (
            "src/lib.rs",
            "pub mod a;\nmod b;\npub mod c;\npub use b::Shared as Common;\n#[cfg(test)]\nmod tests;\n\
             pub(crate) use c::*;\nmacro_rules! m { () => { $crate::a::f() } }\npub(crate) use m;",
        ),
        ("src/a.rs", "use crate::{Common, b::{self}};\n// crate::c::x\nfn f() { let s = \"super::c\"; }"),
        ("src/b.rs", "pub struct Shared;\npub mod inner { pub fn g() { super::super::c::h() } }"),
        ("src/c.rs", "/* crate::b */ pub fn h() { r#\"crate::a\"#; 'x'; }\n#[cfg(all(test, unix))]\nmod t { use crate::a; }"),
        ("src/d.rs", "pub fn k() { crate::m!(); }"),
        ("src/e/mod.rs", "mod f;\npub use f::F;\nfn u() -> F { F }"),
        ("src/e/f.rs", "pub struct F;\nfn v() { super::super::Common; crate::h(); }"),
    ]);
    let read = |p: &Path| files.get(p.to_str().unwrap_or("")).map(|s| s.to_string());
    let one = |roots: &[&str]| Graph::load(Path::new("src"), roots, &read);
    let g = one(&["lib.rs"]);
    let names =
        |es: &BTreeMap<usize, (usize, String)>| es.keys().map(|&k| g.files[k].clone()).collect::<Vec<_>>();
    let edges = g.edges();
    let of = |f: &str| names(&edges[g.files.iter().position(|x| x == f).expect(f)]);
    // a names b twice: through the root's re-export and as `b::{self}`; not c (a comment).
    assert_eq!(of("a.rs"), ["b.rs"]);
    assert_eq!(of("b.rs"), ["c.rs"], "an inline module's `super::super::`");
    assert_eq!(of("c.rs"), Vec::<String>::new(), "a comment, a raw string and test code name nothing");
    assert_eq!(of("lib.rs"), ["a.rs", "b.rs", "c.rs"], "a re-export, a glob import, `$crate::` in a macro");
    assert_eq!(g.cycles(), Vec::<String>::new());
    assert!(!g.files.contains(&"tests.rs".to_string()), "a `#[cfg(test)]` file is not read");
    // A second crate where e/f.rs names lib.rs's re-export of b (so b) and, through the root's
    // glob, c; d names the root's macro: a cycle through lib.rs.
    let files2 = files.clone();
    let read2 = |p: &Path| {
        let p = p.to_str().unwrap_or("");
        if p == "src/lib.rs" {
            return Some(format!("{}\npub mod d;\npub mod e;\nfn w() {{ d::k(); }}", files2["src/lib.rs"]));
        }
        files2.get(p).map(|s| s.to_string())
    };
    let g = Graph::load(Path::new("src"), &["lib.rs"], &read2);
    let edges = g.edges();
    let of = |f: &str| {
        let es = &edges[g.files.iter().position(|x| x == f).expect(f)];
        es.keys().map(|&k| g.files[k].clone()).collect::<Vec<_>>()
    };
    assert_eq!(of("e/f.rs"), ["b.rs", "c.rs"]);
    assert_eq!(of("e/mod.rs"), ["e/f.rs"]);
    assert_eq!(of("d.rs"), ["lib.rs"]);
    assert_eq!(g.cycles(), ["{d.rs, lib.rs}: d.rs:1 `crate::m` → lib.rs:12 `d::k` → d.rs"]);
}
