//! The rules docs/architecture.md states, read from its ```` ```layers ```` block:
//!
//! ```text
//! crates: crds vc-runtime < tenant-pki < vc-manager kubectl-vc      (a crate depends only on lower groups)
//! layers vc-dns: error limits < index objects < watch server < lib  (a module imports only its layer and lower)
//! circle syncer: attach config context                              (a known circle: may shrink, never grow)
//! ```
//!
//! A layer entry names a module (`snapshot::schedule`; `lib` is the crate root) and covers its submodules
//! unless they are named themselves. `#` starts a comment.

use crate::{Error, Result};

/// What the architecture document requires.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// Crate groups, bottom first.
    pub crates: Vec<Vec<String>>,
    /// Per crate (package name): its module layers, bottom first.
    pub layers: Vec<(String, Vec<Vec<String>>)>,
    /// Per crate: the modules of a circle not yet broken.
    pub circles: Vec<(String, Vec<String>)>,
}

/// The rules of the first ```` ```layers ```` block of `document`.
pub fn parse(document: &str) -> Result<Rules> {
    let start = document.find("```layers\n").ok_or(Error::NoRules)? + "```layers\n".len();
    let end = start + document[start..].find("```").ok_or(Error::NoRules)?;
    let mut rules = Rules::default();
    for (number, line) in document[start..end].lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let bad = |problem: &str| Error::Rule {
            line: line.to_owned(),
            problem: format!("{problem} (line {} of the block)", number + 1),
        };
        let (head, body) = line.split_once(':').ok_or_else(|| bad("no `:`"))?;
        let groups = || -> Vec<Vec<String>> {
            body.split('<')
                .map(|group| group.split_whitespace().map(str::to_owned).collect())
                .collect()
        };
        let words: Vec<&str> = head.split_whitespace().collect();
        match words.as_slice() {
            ["crates"] => rules.crates = groups(),
            ["layers", krate] => rules.layers.push(((*krate).to_owned(), groups())),
            ["circle", krate] => rules.circles.push((
                (*krate).to_owned(),
                body.split_whitespace().map(str::to_owned).collect(),
            )),
            _ => return Err(bad("expected `crates:`, `layers <crate>:` or `circle <crate>:`")),
        }
        if rules
            .crates
            .iter()
            .chain(rules.layers.iter().flat_map(|(_, l)| l))
            .any(Vec::is_empty)
        {
            return Err(bad("an empty group"));
        }
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_is_read_and_nothing_else() {
        let document = "# Architecture\n\n```text\ncrates: x\n```\n\n```layers\n# the order\ncrates: crds vc-runtime < vc-dns\nlayers vc-dns: error < index objects # pure\n\ncircle syncer: attach config\n```\n";
        assert_eq!(
            parse(document).expect("rules"),
            Rules {
                crates: vec![vec!["crds".into(), "vc-runtime".into()], vec!["vc-dns".into()]],
                layers: vec![(
                    "vc-dns".into(),
                    vec![vec!["error".into()], vec!["index".into(), "objects".into()]]
                )],
                circles: vec![("syncer".into(), vec!["attach".into(), "config".into()])],
            }
        );
    }

    #[test]
    fn a_missing_block_or_a_bad_line_is_refused() {
        assert!(matches!(parse("# nothing"), Err(Error::NoRules)));
        for line in ["crates x", "layer vc-dns: a", "layers vc-dns: a < < b"] {
            let error = parse(&format!("```layers\n{line}\n```\n")).expect_err(line);
            assert!(matches!(error, Error::Rule { .. }), "{line}: {error}");
        }
    }
}
