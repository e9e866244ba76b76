//! The paths a file's code names: every leaf of its `use` trees (re-exports too), and every path written
//! inline from `crate::`, `super::` or `self::` (`crate::write_gate::GateMetrics` in a field type is an
//! import as much as a `use`).

use crate::lex::is_ident;

/// A path the code names, and the line it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    /// The path's segments (`["crate", "metrics", "Metrics"]`).
    pub path: Vec<String>,
    /// 1-based line.
    pub line: usize,
    /// Whether it is a `pub use` (a re-export other modules may import through).
    pub reexport: bool,
}

/// Every path `code` (already reduced by [`crate::lex::code`]) names.
pub fn imports(code: &str) -> Vec<Import> {
    let mut found = Vec::new();
    let mut rest = code.to_owned();
    for (start, end, reexport) in use_statements(code) {
        let line = line_of(code, start);
        for path in use_tree(&code[start + 3..end]) {
            found.push(Import { path, line, reexport });
        }
        let blanked: String = code[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        rest.replace_range(start..end, &blanked);
    }
    found.extend(inline_paths(&rest));
    found
}

fn line_of(code: &str, offset: usize) -> usize {
    code[..offset].matches('\n').count() + 1
}

/// `(start of "use", offset of its ";", pub?)` for every `use` declaration.
fn use_statements(code: &str) -> Vec<(usize, usize, bool)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = code[from..].find("use") {
        let start = from + offset;
        from = start + 3;
        let before = code[..start].chars().next_back();
        let after = code[start + 3..].chars().next();
        if before.is_some_and(is_ident) || !after.is_some_and(char::is_whitespace) {
            continue;
        }
        // A declaration follows `;`, a brace, an attribute, or a visibility.
        let head = code[..start].trim_end();
        let reexport = head.ends_with("pub")
            || (head.ends_with(')') && head.rfind("pub(").is_some_and(|p| !head[p..].contains('\n')));
        let declared = head.is_empty() || head.ends_with([';', '{', '}', ']']) || reexport;
        if !declared {
            continue;
        }
        let Some(end) = code[start..].find(';') else { break };
        let end = start + end;
        if bytes[start..end].contains(&b'=') {
            continue;
        }
        found.push((start, end, reexport));
        from = end;
    }
    found
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    Path,
    Open,
    Close,
    Comma,
    Glob,
}

fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ':' if chars.get(i + 1) == Some(&':') => {
                out.push(Token::Path);
                i += 2;
            }
            '{' => {
                out.push(Token::Open);
                i += 1;
            }
            '}' => {
                out.push(Token::Close);
                i += 1;
            }
            ',' => {
                out.push(Token::Comma);
                i += 1;
            }
            '*' => {
                out.push(Token::Glob);
                i += 1;
            }
            c if is_ident(c) => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
            _ => i += 1,
        }
    }
    out
}

/// The leaves of a use tree (`crate::{a::{self, B}, c::*}` gives `crate::a`, `crate::a::B`, `crate::c`).
pub fn use_tree(text: &str) -> Vec<Vec<String>> {
    let tokens = tokens(text);
    let mut leaves = Vec::new();
    let mut at = 0;
    tree(&tokens, &mut at, &[], &mut leaves);
    leaves
}

fn tree(tokens: &[Token], at: &mut usize, prefix: &[String], leaves: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(*at) {
            Some(Token::Ident(name)) => {
                *at += 1;
                if name != "self" || path.is_empty() {
                    path.push(name.clone());
                }
                if tokens.get(*at) == Some(&Token::Path) {
                    *at += 1;
                } else {
                    // `as alias`: the alias names nothing new.
                    if matches!(tokens.get(*at), Some(Token::Ident(word)) if word == "as") {
                        *at += 2;
                    }
                    leaves.push(path);
                    return;
                }
            }
            Some(Token::Path) => *at += 1,
            Some(Token::Glob) => {
                *at += 1;
                leaves.push(path);
                return;
            }
            Some(Token::Open) => {
                *at += 1;
                loop {
                    match tokens.get(*at) {
                        None => return,
                        Some(Token::Close) => {
                            *at += 1;
                            return;
                        }
                        Some(Token::Comma) => *at += 1,
                        Some(_) => tree(tokens, at, &path, leaves),
                    }
                }
            }
            _ => return,
        }
    }
}

/// Paths written inline from `crate::`, `super::` or `self::` (not `$crate::`, which is a macro's).
fn inline_paths(code: &str) -> Vec<Import> {
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let (offset, c) = chars[i];
        let boundary = i == 0 || {
            let before = chars[i - 1].1;
            !is_ident(before) && before != '$' && before != ':'
        };
        if !boundary || !is_ident(c) {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut path = Vec::new();
        loop {
            let start = j;
            while j < chars.len() && is_ident(chars[j].1) {
                j += 1;
            }
            path.push(chars[start..j].iter().map(|(_, c)| c).collect::<String>());
            if chars.get(j).map(|(_, c)| *c) == Some(':')
                && chars.get(j + 1).map(|(_, c)| *c) == Some(':')
                && chars.get(j + 2).is_some_and(|(_, c)| is_ident(*c))
            {
                j += 2;
            } else {
                break;
            }
        }
        if matches!(path[0].as_str(), "crate" | "super" | "self") && path.len() > 1 {
            found.push(Import {
                path,
                line: line_of(code, offset),
                reexport: false,
            });
        }
        i = j.max(i + 1);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(code: &str) -> Vec<String> {
        imports(code).into_iter().map(|i| i.path.join("::")).collect()
    }

    #[test]
    fn use_trees_are_expanded_to_their_leaves() {
        for (tree, leaves) in [
            ("crate::a::B", vec!["crate::a::B"]),
            (
                "crate::{a::{self, B}, c::*}",
                vec!["crate::a", "crate::a::B", "crate::c"],
            ),
            (
                "super::{convert::{self, X as Y}, down::z}",
                vec!["super::convert", "super::convert::X", "super::down::z"],
            ),
            (
                "std::{collections::BTreeMap, sync::Arc}",
                vec!["std::collections::BTreeMap", "std::sync::Arc"],
            ),
            ("figures::{A, B,}", vec!["figures::A", "figures::B"]),
            ("self::a::b", vec!["self::a::b"]),
        ] {
            assert_eq!(
                use_tree(tree).iter().map(|p| p.join("::")).collect::<Vec<_>>(),
                leaves,
                "{tree}"
            );
        }
    }

    #[test]
    fn declarations_re_exports_and_inline_paths_are_found() {
        let code = "use crate::a;\npub use crate::b::C;\npub(crate) use super::d;\nstruct S { g: crate::e::G, h: super::super::f::H }\nmacro_rules! m { () => { $crate::x::y } }\nfn f() { let used = 1; }\n";
        assert_eq!(
            paths(code),
            [
                "crate::a",
                "crate::b::C",
                "super::d",
                "crate::e::G",
                "super::super::f::H"
            ]
        );
        let found = imports(code);
        assert_eq!(
            found.iter().map(|i| (i.line, i.reexport)).collect::<Vec<_>>(),
            [(1, false), (2, true), (3, true), (4, false), (4, false)]
        );
    }
}
