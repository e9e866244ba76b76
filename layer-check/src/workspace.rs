//! The workspace as the check sees it: its crates (from the root `Cargo.toml`), what each depends on, the
//! modules of each library (one a file under `src/`, leaving out `main.rs`, `src/bin/` and modules declared
//! only for tests or fixtures), and the arrows between them, module to module, with re-exports followed to
//! where an item is defined.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use crate::{
    Error, Result,
    imports::{Import, imports},
    lex,
};

/// A module: its path in its crate (`""` for the crate root, `"snapshot::schedule"`).
pub type Module = String;

/// One crate of the workspace.
#[derive(Debug)]
pub struct Crate {
    /// Package name (`vc-runtime`).
    pub package: String,
    /// Library name (`vc_runtime`).
    pub lib: String,
    /// Folder, relative to the workspace root.
    pub dir: String,
    /// Workspace crates it depends on (normal, dev and build dependencies), by package name.
    pub depends_on: BTreeSet<String>,
    /// Its library's modules and the file each is.
    pub modules: BTreeMap<Module, PathBuf>,
    /// Arrows between its modules: `(from, to)` and where `from` names `to` first (`file:line path`).
    pub arrows: BTreeMap<(Module, Module), String>,
}

/// Reads the workspace at `root`.
pub fn read(root: &Path) -> Result<Vec<Crate>> {
    let manifest = read_text(&root.join("Cargo.toml"))?;
    let members = members(&manifest).ok_or_else(|| Error::Manifest {
        path: root.join("Cargo.toml"),
        problem: "no `members = [...]` in [workspace]".into(),
    })?;
    let mut crates = Vec::new();
    for dir in &members {
        let path = root.join(dir).join("Cargo.toml");
        let manifest = read_text(&path)?;
        let package = table_value(&manifest, "package", "name").ok_or_else(|| Error::Manifest {
            path: path.clone(),
            problem: "no [package] name".into(),
        })?;
        let lib = table_value(&manifest, "lib", "name").unwrap_or_else(|| package.replace('-', "_"));
        let dependencies = ["dependencies", "dev-dependencies", "build-dependencies"]
            .iter()
            .flat_map(|table| table_keys(&manifest, table))
            .collect();
        crates.push(Crate {
            package,
            lib,
            dir: dir.clone(),
            depends_on: dependencies,
            modules: BTreeMap::new(),
            arrows: BTreeMap::new(),
        });
    }
    let packages: BTreeSet<String> = crates.iter().map(|c| c.package.clone()).collect();
    for krate in &mut crates {
        krate.depends_on.retain(|d| packages.contains(d));
        let src = root.join(&krate.dir).join("src");
        if src.join("lib.rs").is_file() {
            krate.modules = modules(&src)?;
            krate.arrows = arrows(root, &krate.modules)?;
        }
    }
    Ok(crates)
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

/// The workspace's member folders.
fn members(manifest: &str) -> Option<Vec<String>> {
    let start = manifest.find("members")?;
    let open = start + manifest[start..].find('[')?;
    let close = open + manifest[open..].find(']')?;
    Some(
        manifest[open + 1..close]
            .split(',')
            .map(|m| m.trim().trim_matches('"').to_owned())
            .filter(|m| !m.is_empty())
            .collect(),
    )
}

/// The lines of one `[table]` of a manifest.
fn table<'a>(manifest: &'a str, name: &str) -> impl Iterator<Item = &'a str> {
    let header = format!("[{name}]");
    manifest
        .lines()
        .skip_while(move |line| line.trim() != header)
        .skip(1)
        .take_while(|line| !line.trim_start().starts_with('['))
        .filter(|line| !line.trim_start().starts_with('#'))
}

fn table_value(manifest: &str, name: &str, key: &str) -> Option<String> {
    table(manifest, name).find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
    })
}

fn table_keys(manifest: &str, name: &str) -> Vec<String> {
    table(manifest, name)
        .filter_map(|line| Some(line.split_once('=')?.0.trim().to_owned()))
        .filter(|k| !k.is_empty())
        .collect()
}

/// The library's modules: every `.rs` under `src/` but `main.rs` and `src/bin/`, less the modules declared
/// only for tests or fixtures (`#[cfg(test)] mod x;`, `#[cfg(feature = "fixtures")] mod x;`) and theirs.
fn modules(src: &Path) -> Result<BTreeMap<Module, PathBuf>> {
    let mut files = Vec::new();
    collect(src, &mut files)?;
    let mut all = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap_or(&file);
        let parts: Vec<String> = relative
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.first().is_some_and(|p| p == "bin") || parts == ["main"] {
            continue;
        }
        let module = match parts.as_slice() {
            [only] if only == "lib" => String::new(),
            [rest @ .., last] if last == "mod" => rest.join("::"),
            all => all.join("::"),
        };
        all.insert(module, file);
    }
    let mut excluded = BTreeSet::new();
    for (module, file) in &all {
        for child in test_only_children(&read_text(file)?) {
            excluded.insert(join(module, &child));
        }
    }
    all.retain(|module, _| {
        !excluded
            .iter()
            .any(|e| module == e || module.starts_with(&format!("{e}::")))
    });
    Ok(all)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Read {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries {
        let path = entry
            .map_err(|source| Error::Read {
                path: dir.to_owned(),
                source,
            })?
            .path();
        if path.is_dir() {
            collect(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    Ok(())
}

/// Children declared `#[cfg(..test..)] mod x;` or `#[cfg(..fixtures..)] mod x;`.
fn test_only_children(source: &str) -> Vec<String> {
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    let mut children = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let declared = line
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'));
        let Some(name) = declared else { continue };
        let attributes = lines[..i].iter().rev().take_while(|l| l.starts_with("#["));
        if attributes
            .into_iter()
            .any(|a| a.starts_with("#[cfg(") && (a.contains("test") || a.contains("fixtures")))
        {
            children.push(name.trim().to_owned());
        }
    }
    children
}

fn join(parent: &str, child: &str) -> String {
    match parent {
        "" => child.to_owned(),
        parent => format!("{parent}::{child}"),
    }
}

fn parent(module: &str) -> &str {
    module.rfind("::").map_or("", |i| &module[..i])
}

/// The imports of every module, and the arrows they make.
fn arrows(root: &Path, modules: &BTreeMap<Module, PathBuf>) -> Result<BTreeMap<(Module, Module), String>> {
    let mut found = BTreeMap::new();
    for (module, file) in modules {
        found.insert(module.clone(), imports(&lex::code(&read_text(file)?)));
    }
    let resolver = Resolver {
        modules,
        imports: &found,
    };
    let mut arrows = BTreeMap::new();
    for (module, imports) in &found {
        for import in imports {
            let Some(target) = resolver.resolve(module, &import.path, 0) else {
                continue;
            };
            if &target == module || !modules.contains_key(&target) {
                continue;
            }
            let file = modules[module].strip_prefix(root).unwrap_or(&modules[module]);
            arrows
                .entry((module.clone(), target))
                .or_insert_with(|| format!("{}:{} {}", file.display(), import.line, import.path.join("::")));
        }
    }
    Ok(arrows)
}

struct Resolver<'a> {
    modules: &'a BTreeMap<Module, PathBuf>,
    imports: &'a BTreeMap<Module, Vec<Import>>,
}

impl Resolver<'_> {
    /// The module a path written in `module` leads to, following re-exports of the item it names; `None`
    /// for another crate's path.
    fn resolve(&self, module: &str, path: &[String], depth: usize) -> Option<Module> {
        let (mut at, rest) = match path.first()?.as_str() {
            "crate" => (String::new(), &path[1..]),
            "self" => (module.to_owned(), &path[1..]),
            "super" => {
                let mut at = parent(module).to_owned();
                let mut rest = &path[1..];
                while rest.first().is_some_and(|s| s == "super") {
                    at = parent(&at).to_owned();
                    rest = &rest[1..];
                }
                (at, rest)
            }
            // A child module named without `self::` (2018 paths), else another crate.
            first if self.modules.contains_key(&join(module, first)) => (module.to_owned(), path),
            _ => return None,
        };
        let mut item = None;
        for segment in rest {
            let child = join(&at, segment);
            if self.modules.contains_key(&child) {
                at = child;
            } else {
                item = Some(segment.as_str());
                break;
            }
        }
        // An item re-exported by `at` (`pub use error::Error` in lib.rs) is where it is defined.
        if let Some(item) = item
            && depth < 8
            && let Some(reexport) = self.imports.get(&at).and_then(|imports| {
                imports
                    .iter()
                    .find(|i| i.reexport && i.path.last().is_some_and(|last| last == item))
            })
            && let Some(defined) = self.resolve(&at, &reexport.path, depth + 1)
        {
            return Some(defined);
        }
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_read_for_members_names_and_dependencies() {
        let root = "[workspace]\nresolver = \"3\"\nmembers = [\"crds\", \"runtime\",\n \"syncer\"]\n";
        assert_eq!(members(root).expect("members"), ["crds", "runtime", "syncer"]);
        let crate_manifest = "[package]\nname = \"vc-dns\"\n\n[lib]\nname = \"vc_dns\"\n\n[dependencies]\n# note\ncrds = { workspace = true }\nkube = { workspace = true }\n\n[dev-dependencies]\nmock-apiserver = { workspace = true }\n";
        assert_eq!(
            table_value(crate_manifest, "package", "name").as_deref(),
            Some("vc-dns")
        );
        assert_eq!(
            table_value(crate_manifest, "lib", "name").as_deref(),
            Some("vc_dns")
        );
        assert_eq!(table_keys(crate_manifest, "dependencies"), ["crds", "kube"]);
        assert_eq!(table_keys(crate_manifest, "dev-dependencies"), ["mock-apiserver"]);
    }

    #[test]
    fn modules_declared_for_tests_or_fixtures_are_found() {
        let lib = "pub mod a;\n#[cfg(test)]\nmod mock_tests;\n#[cfg(feature = \"fixtures\")]\npub mod fixtures;\n#[cfg(unix)]\nmod unix;\n";
        assert_eq!(test_only_children(lib), ["mock_tests", "fixtures"]);
    }

    #[test]
    fn paths_lead_to_the_module_that_defines_the_item() {
        let modules: BTreeMap<Module, PathBuf> = [
            "",
            "error",
            "pod",
            "pod::down",
            "pod::ephemeral",
            "usage",
            "usage::metrics",
        ]
        .iter()
        .map(|m| ((*m).to_owned(), PathBuf::from(format!("{m}.rs"))))
        .collect();
        let reexport = |path: &str| Import {
            path: path.split("::").map(str::to_owned).collect(),
            line: 1,
            reexport: true,
        };
        let imports = BTreeMap::from([(String::new(), vec![reexport("error::Error")])]);
        let resolver = Resolver {
            modules: &modules,
            imports: &imports,
        };
        let path = |p: &str| p.split("::").map(str::to_owned).collect::<Vec<_>>();
        for (from, to, expected) in [
            ("pod::down", "super::ephemeral::sync", Some("pod::ephemeral")),
            ("pod::down", "crate::Error", Some("error")),
            (
                "pod::down",
                "crate::usage::metrics::UsageLabels",
                Some("usage::metrics"),
            ),
            ("usage", "metrics::UsageLabels", Some("usage::metrics")),
            ("pod::down", "super::super::usage", Some("usage")),
            ("pod::down", "kube::Api", None),
            ("pod", "self::down::sync", Some("pod::down")),
        ] {
            assert_eq!(
                resolver.resolve(from, &path(to), 0).as_deref(),
                expected,
                "{from}: {to}"
            );
        }
    }
}
