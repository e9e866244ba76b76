//! The rules held against the workspace: every breach, in words that name the files and lines to open.

use std::collections::{BTreeMap, BTreeSet};

use crate::{rules::Rules, workspace::Crate};

/// Every breach of `rules` by `crates`; empty when the workspace is as the document says.
pub fn check(crates: &[Crate], rules: &Rules) -> Vec<String> {
    let mut breaches = crate_order(crates, rules);
    for krate in crates {
        let allowed: BTreeSet<&str> = rules
            .circles
            .iter()
            .filter(|(name, _)| name == &krate.package)
            .flat_map(|(_, modules)| modules.iter().map(String::as_str))
            .collect();
        breaches.extend(circles(krate, &allowed));
        if let Some((_, layers)) = rules.layers.iter().find(|(name, _)| name == &krate.package) {
            breaches.extend(layering(krate, layers));
        }
    }
    let named = rules
        .layers
        .iter()
        .map(|(name, _)| name)
        .chain(rules.circles.iter().map(|(name, _)| name));
    for name in named {
        if !crates.iter().any(|c| &c.package == name) {
            breaches.push(format!(
                "docs/architecture.md names crate {name}, which the workspace does not have"
            ));
        }
    }
    breaches
}

/// Each crate depends only on crates of lower groups.
fn crate_order(crates: &[Crate], rules: &Rules) -> Vec<String> {
    let group = |name: &str| rules.crates.iter().position(|g| g.iter().any(|c| c == name));
    let mut breaches = Vec::new();
    for krate in crates {
        let Some(own) = group(&krate.package) else {
            breaches.push(format!(
                "crate {} is in no group of the crate order (`crates:` in docs/architecture.md)",
                krate.package
            ));
            continue;
        };
        for dependency in &krate.depends_on {
            if group(dependency).is_none_or(|theirs| theirs >= own) {
                breaches.push(format!(
                    "crate {} depends on {dependency} ({}/Cargo.toml), which is not below it in the crate order",
                    krate.package, krate.dir
                ));
            }
        }
    }
    breaches
}

/// The layer of a module: that of the longest entry naming it or one of its parents.
fn layer_of(module: &str, layers: &[Vec<String>]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (index, group) in layers.iter().enumerate() {
        for entry in group {
            let entry = if entry == "lib" { "" } else { entry.as_str() };
            let covers = module == entry
                || entry.is_empty() && module.is_empty()
                || (!entry.is_empty() && module.starts_with(&format!("{entry}::")));
            if covers && best.is_none_or(|(length, _)| entry.len() > length) {
                best = Some((entry.len(), index));
            }
        }
    }
    best.map(|(_, index)| index)
}

/// Every module is on a layer, every layer entry is a module, and no arrow runs up.
fn layering(krate: &Crate, layers: &[Vec<String>]) -> Vec<String> {
    let mut breaches = Vec::new();
    for entry in layers.iter().flatten() {
        let module = if entry == "lib" { "" } else { entry.as_str() };
        if !krate.modules.contains_key(module) {
            breaches.push(format!(
                "docs/architecture.md puts module {entry} of {} on a layer, but it has none such",
                krate.package
            ));
        }
    }
    for (module, file) in &krate.modules {
        if layer_of(module, layers).is_none() {
            breaches.push(format!(
                "module {} of {} ({}) is on no layer of docs/architecture.md",
                shown(module),
                krate.package,
                file.display()
            ));
        }
    }
    for ((from, to), place) in krate.arrows.iter().filter(|((from, to), _)| !nested(from, to)) {
        if let (Some(low), Some(high)) = (layer_of(from, layers), layer_of(to, layers))
            && high > low
        {
            breaches.push(format!(
                "{}: {} imports {}, a higher layer ({place})",
                krate.package,
                shown(from),
                shown(to)
            ));
        }
    }
    breaches
}

/// Whether one module is the other's ancestor (the crate root is everyone's). A folder's `mod.rs` and its
/// files are one place: they may import each other (`super::Shared`, `child::run`), and those arrows make
/// no circle and run against no layer.
fn nested(a: &str, b: &str) -> bool {
    a.is_empty() || b.is_empty() || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

fn shown(module: &str) -> &str {
    if module.is_empty() { "lib" } else { module }
}

/// Circles of modules (strongly connected components of two or more), but those within a known circle.
fn circles(krate: &Crate, allowed: &BTreeSet<&str>) -> Vec<String> {
    let mut graph: BTreeMap<&str, Vec<&str>> =
        krate.modules.keys().map(|m| (m.as_str(), Vec::new())).collect();
    for (from, to) in krate.arrows.keys().filter(|(from, to)| !nested(from, to)) {
        graph.entry(from.as_str()).or_default().push(to.as_str());
    }
    let mut breaches = Vec::new();
    let mut in_circles = BTreeSet::new();
    for component in components(&graph) {
        if component.len() < 2 {
            continue;
        }
        in_circles.extend(component.iter().copied());
        let outside: Vec<&str> = component
            .iter()
            .copied()
            .filter(|m| !allowed.contains(shown(m)))
            .collect();
        if outside.is_empty() {
            continue;
        }
        let ties: Vec<String> = krate
            .arrows
            .iter()
            .filter(|((from, to), _)| {
                !nested(from, to) && component.contains(&from.as_str()) && component.contains(&to.as_str())
            })
            .map(|((from, to), place)| format!("    {} -> {} ({place})", shown(from), shown(to)))
            .collect();
        breaches.push(format!(
            "{}: an import circle of {} modules ({}); not a known circle: {}\n{}",
            krate.package,
            component.len(),
            component.iter().map(|m| shown(m)).collect::<Vec<_>>().join(", "),
            outside.iter().map(|m| shown(m)).collect::<Vec<_>>().join(", "),
            ties.join("\n")
        ));
    }
    for module in allowed {
        let module_key = if *module == "lib" { "" } else { module };
        if !in_circles.contains(module_key) {
            breaches.push(format!(
                "{}: docs/architecture.md lists {module} in a known circle, but it is in none: take it off the list",
                krate.package
            ));
        }
    }
    breaches
}

/// Strongly connected components (Tarjan), each sorted.
fn components<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(node: &'a str, graph: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let next = s.index.len();
        s.index.insert(node, next);
        s.low.insert(node, next);
        s.stack.push(node);
        s.on_stack.insert(node);
        for &to in graph.get(node).into_iter().flatten() {
            if !s.index.contains_key(to) {
                visit(to, graph, s);
                let low = s.low[node].min(s.low[to]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(to) {
                let low = s.low[node].min(s.index[to]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.push(top);
                if top == node {
                    break;
                }
            }
            component.sort_unstable();
            s.found.push(component);
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for &node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(node, graph, &mut state);
        }
    }
    state.found
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::workspace::Module;

    fn krate(package: &str, arrows: &[(&str, &str)], depends_on: &[&str]) -> Crate {
        let mut modules: BTreeMap<Module, PathBuf> = BTreeMap::new();
        for (from, to) in arrows {
            for m in [from, to] {
                let module = if *m == "lib" {
                    String::new()
                } else {
                    (*m).to_owned()
                };
                modules.insert(module, PathBuf::from(format!("{m}.rs")));
            }
        }
        Crate {
            package: package.into(),
            lib: package.replace('-', "_"),
            dir: package.into(),
            depends_on: depends_on.iter().map(|d| (*d).to_owned()).collect(),
            arrows: arrows
                .iter()
                .map(|(f, t)| {
                    let m = |m: &str| if m == "lib" { String::new() } else { m.to_owned() };
                    ((m(f), m(t)), format!("{f}.rs:1"))
                })
                .collect(),
            modules,
        }
    }

    fn rules(text: &str) -> Rules {
        crate::rules::parse(&format!("```layers\n{text}\n```\n")).expect("rules")
    }

    #[test]
    fn a_circle_is_found_with_what_ties_it() {
        let krate = krate(
            "k",
            &[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("lib", "a")],
            &[],
        );
        let breaches = check(&[krate], &rules("crates: k"));
        assert_eq!(breaches.len(), 1, "{breaches:?}");
        assert!(
            breaches[0].contains("circle of 3 modules (a, b, c)"),
            "{}",
            breaches[0]
        );
        assert!(breaches[0].contains("c -> a (c.rs:1)"), "{}", breaches[0]);
    }

    #[test]
    fn a_folder_and_its_files_make_no_circle_but_siblings_do() {
        let krate = krate(
            "k",
            &[
                ("pod", "pod::down"),
                ("pod::down", "pod"),
                ("pod::down", "pod::ephemeral"),
                ("pod::ephemeral", "pod::down"),
            ],
            &[],
        );
        let breaches = check(&[krate], &rules("crates: k"));
        assert_eq!(breaches.len(), 1, "{breaches:?}");
        assert!(
            breaches[0].contains("circle of 2 modules (pod::down, pod::ephemeral)"),
            "{}",
            breaches[0]
        );
    }

    #[test]
    fn a_known_circle_may_shrink_but_not_grow_and_must_be_listed_truly() {
        let two = krate("k", &[("a", "b"), ("b", "a")], &[]);
        assert!(check(&[two], &rules("crates: k\ncircle k: a b")).is_empty());
        let grown = krate("k", &[("a", "b"), ("b", "c"), ("c", "a")], &[]);
        let breaches = check(&[grown], &rules("crates: k\ncircle k: a b"));
        assert!(
            breaches.len() == 1 && breaches[0].contains("not a known circle: c"),
            "{breaches:?}"
        );
        let broken = krate("k", &[("a", "b")], &[]);
        let breaches = check(&[broken], &rules("crates: k\ncircle k: a b"));
        assert_eq!(breaches.len(), 2, "{breaches:?}");
        assert!(breaches.iter().all(|b| b.contains("is in none")), "{breaches:?}");
    }

    #[test]
    fn an_import_against_the_layers_or_a_module_on_none_is_a_breach() {
        let krate = krate(
            "k",
            &[
                ("lib", "server"),
                ("server", "index"),
                ("index", "error"),
                ("error", "server"),
                ("index::pure", "error"),
            ],
            &[],
        );
        let breaches = check(
            &[krate],
            &rules("crates: k\nlayers k: error < index < server lib"),
        );
        assert!(
            breaches
                .iter()
                .any(|b| b.contains("error imports server, a higher layer (error.rs:1)")),
            "{breaches:?}"
        );
        let krate = self::krate("k", &[("a", "b"), ("c", "a")], &[]);
        let breaches = check(&[krate], &rules("crates: k\nlayers k: b < a < gone"));
        assert_eq!(breaches.len(), 2, "{breaches:?}");
        assert!(
            breaches
                .iter()
                .any(|b| b.contains("module c of k (c.rs) is on no layer")),
            "{breaches:?}"
        );
        assert!(
            breaches
                .iter()
                .any(|b| b.contains("module gone of k on a layer, but it has none")),
            "{breaches:?}"
        );
    }

    #[test]
    fn a_crate_depends_only_on_lower_groups() {
        let crates = [
            krate("crds", &[], &[]),
            krate("tenant-pki", &[], &["crds"]),
            krate("vc-manager", &[], &["crds", "tenant-pki"]),
            krate("kubectl-vc", &[], &["vc-manager"]),
            krate("stray", &[], &[]),
        ];
        let breaches = check(
            &crates,
            &rules("crates: crds < tenant-pki < vc-manager kubectl-vc"),
        );
        assert_eq!(breaches.len(), 2, "{breaches:?}");
        assert!(
            breaches[0].contains("kubectl-vc depends on vc-manager"),
            "{breaches:?}"
        );
        assert!(breaches[1].contains("stray is in no group"), "{breaches:?}");
    }
}
