//! Rust source reduced to its code: comments, string and character literals blanked (a doc link such as
//! [`crate::tenant::Owner`] names no import), and `#[cfg(test)]` modules written inline removed (tests may
//! import anything).

/// `source` with comments and literals replaced by spaces (newlines kept) and inline test modules
/// removed.
pub fn code(source: &str) -> String {
    without_test_modules(&blank_comments_and_literals(source))
}

fn blank_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            // r"..", r#".."#, br#".."#: ends at a quote followed by as many hashes.
            let start = i;
            while chars[i] != '"' {
                i += 1;
            }
            i += 1;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            for &c in &chars[start..i.min(chars.len())] {
                blank(&mut out, c);
            }
        } else if c == '"' {
            blank(&mut out, c);
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            if i < chars.len() {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{..}'), or a lifetime ('a), which is kept.
            let end = match next {
                Some('\\') => (i + 2..chars.len()).find(|&j| chars[j] == '\''),
                Some(_) if chars.get(i + 2) == Some(&'\'') => Some(i + 2),
                _ => None,
            };
            match end {
                Some(end) => {
                    for &c in &chars[i..=end] {
                        blank(&mut out, c);
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The number of hashes of a raw string literal starting at `i`, if one does.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let before_ok = i == 0 || !is_ident(chars[i - 1]);
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if !before_ok || chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some(hashes)
}

/// Whether `c` can be part of an identifier.
pub fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Removes `#[cfg(test)] mod name { ... }` (and `#[cfg(any(test, ..))]`) blocks.
fn without_test_modules(code: &str) -> String {
    let mut out = code.to_owned();
    let mut from = 0;
    while let Some(found) = out[from..].find("#[cfg(") {
        let start = from + found;
        let Some(close) = out[start..].find(']') else {
            break;
        };
        let attribute = &out[start..start + close];
        let rest = out[start + close + 1..].trim_start();
        let is_test = attribute.contains("test");
        let declared = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .fold(rest, |r, visibility| r.strip_prefix(visibility).unwrap_or(r));
        let is_mod_block = declared.starts_with("mod ")
            && rest
                .find('{')
                .is_some_and(|b| rest.find(';').is_none_or(|s| b < s));
        if is_test && is_mod_block {
            let open = start
                + close
                + 1
                + (out[start + close + 1..].len() - rest.len())
                + rest.find('{').unwrap_or(0);
            let mut depth = 0usize;
            let mut end = out.len();
            for (offset, c) in out[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + offset + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let blanked: String = out[start..end]
                .chars()
                .map(|c| if c == '\n' { '\n' } else { ' ' })
                .collect();
            out.replace_range(start..end, &blanked);
            from = start + blanked.len();
        } else {
            from = start + close + 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::code;

    #[test]
    fn comments_literals_and_test_modules_name_no_import() {
        let source = r##"use crate::a; // crate::b
/// [`crate::c`]
/* crate::d /* nested crate::e */ crate::f */
const S: &str = "crate::g \" crate::h";
const R: &str = r#"crate::i " crate::j"#;
const C: char = '"';
fn f<'a>(x: &'a str) -> &'a str { crate::k::f(x) }
#[cfg(test)]
mod tests { use crate::l; fn g() { if true { crate::m(); } } }
#[cfg(test)]
pub(crate) mod helpers { use crate::o; }
use crate::n;
"##;
        let code = code(source);
        for kept in ["crate::a", "crate::k::f", "crate::n", "'a str"] {
            assert!(code.contains(kept), "{kept} lost:\n{code}");
        }
        for gone in [
            "crate::b", "crate::c", "crate::d", "crate::e", "crate::f", "crate::g", "crate::h", "crate::i",
            "crate::j", "crate::l", "crate::m", "crate::o",
        ] {
            assert!(!code.contains(gone), "{gone} kept:\n{code}");
        }
        assert_eq!(code.lines().count(), source.lines().count());
    }
}
