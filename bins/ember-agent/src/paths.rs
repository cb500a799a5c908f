//! Expansion of user-supplied paths as execd does it: `$VAR` / `${VAR}` from
//! an environment, then a leading `~` to a home directory.
use std::path::{Path, PathBuf};

/// Expands `path`. Fails naming the variables that are not defined, rather
/// than silently expanding them to nothing.
pub fn expand(path: &str, lookup: impl Fn(&str) -> Option<String>, home: &Path) -> Result<PathBuf, String> {
    let mut missing: Vec<String> = Vec::new();
    let out = expand_vars(path, |name| {
        let v = lookup(name);
        if v.is_none() {
            missing.push(name.to_string());
        }
        v
    });
    if !missing.is_empty() {
        missing.sort();
        missing.dedup();
        return Err(format!("path references undefined environment variables: {}", missing.join(",")));
    }
    if out == "~" {
        return Ok(home.to_path_buf());
    }
    if let Some(tail) = out.strip_prefix("~/") {
        return Ok(home.join(tail));
    }
    Ok(PathBuf::from(out))
}

/// Replaces `$NAME` and `${NAME}` by `lookup(NAME)`, or by nothing when it
/// is `None`. A `$` not followed by a name is kept.
pub fn expand_vars(s: &str, mut lookup: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let (name, consumed) = match after.strip_prefix('{') {
            Some(braced) => braced.find('}').map_or(("", 0), |end| (&braced[..end], end + 2)),
            None => {
                let end = after
                    .char_indices()
                    .find(|(i, c)| !(c.is_ascii_alphanumeric() || *c == '_') || (*i == 0 && c.is_ascii_digit()))
                    .map_or(after.len(), |(i, _)| i);
                (&after[..end], end)
            }
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        if let Some(v) = lookup(name) {
            out.push_str(&v);
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "A" => Some("/a".into()),
            "B_1" => Some("b".into()),
            _ => None,
        }
    }

    #[test]
    fn variables_and_home() {
        let home = Path::new("/home/u");
        let e = |p: &str| expand(p, env, home);
        assert_eq!(e("$A/x/${B_1}y"), Ok(PathBuf::from("/a/x/by")));
        assert_eq!(e("~"), Ok(PathBuf::from("/home/u")));
        assert_eq!(e("~/w"), Ok(PathBuf::from("/home/u/w")));
        assert_eq!(e("/p~q/$"), Ok(PathBuf::from("/p~q/$")));
        assert_eq!(e("/x/$1"), Ok(PathBuf::from("/x/$1")));
        assert!(e("$NOPE/${ALSO}").unwrap_err().ends_with("ALSO,NOPE"));
        assert_eq!(expand_vars("x=$NOPE:$A", env), "x=:/a");
    }
}
