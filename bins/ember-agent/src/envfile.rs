//! The `EXECD_ENVS` file: `KEY=VALUE` lines merged into every command's
//! environment, re-read per command because `commands.set_env` appends to it.
//!
//! Value forms, as the SDK 1.1.1 writes them:
//! - `KEY='value'`: taken literally (the SDK's lossless form);
//! - `KEY="value"`: `\\ \" \n \r \t` unescaped, then `$NAME` expanded;
//! - `KEY=value`: trimmed, then `$NAME` expanded (execd's original form).
//!
//! Blank lines, `#` comments and lines without `=` are skipped; a later
//! entry for the same key wins.
use crate::paths::expand_vars;
use std::path::Path;

/// Reads and parses the file; a missing or unreadable file is empty.
pub fn read(file: &Path, lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    parse(&std::fs::read_to_string(file).unwrap_or_default(), lookup)
}

pub fn parse(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), value(v.trim(), &lookup)))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn value(v: &str, lookup: &impl Fn(&str) -> Option<String>) -> String {
    if let Some(inner) = quoted(v, '\'') {
        return inner.to_string();
    }
    match quoted(v, '"') {
        Some(inner) => expand_vars(&unescape(inner), lookup),
        None => expand_vars(v, lookup),
    }
}

/// The text between matching quotes around the whole value.
fn quoted(v: &str, q: char) -> Option<&str> {
    v.strip_prefix(q)?.strip_suffix(q)
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "HOME").then(|| "/home/u".to_string())
    }

    #[test]
    fn the_three_value_forms() {
        let text = "# c\n\nA='lit $HOME \\n'\nB=\"it's \\\"x\\\"\\t$HOME\"\n C = plain $HOME/bin \nnoequals\n=v\nD=\n";
        let got = parse(text, env);
        let want = [("A", "lit $HOME \\n"), ("B", "it's \"x\"\t/home/u"), ("C", "plain /home/u/bin"), ("D", "")];
        assert_eq!(got, want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>());
    }
}
