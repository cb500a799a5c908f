//! Query strings with repeated keys (`?path=a&path=b`), which the usual
//! struct-based extractors do not model.

/// Decoded `key=value` pairs in order.
#[derive(Debug, Default)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let Some(raw) = raw else {
            return Query::default();
        };
        let pairs = raw
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        Query(pairs)
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()).collect()
    }
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a
/// byte; malformed escapes are kept literally.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => match (hex(b.get(i + 1)), hex(b.get(i + 2))) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: Option<&u8>) -> Option<u8> {
    (*c? as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_and_decoding() {
        let q = Query::parse(Some("path=%2Ftmp%2Fa+b&path=/x&depth=2&flag&bad=%zz%4"));
        assert_eq!(q.all("path"), vec!["/tmp/a b".to_string(), "/x".to_string()]);
        assert_eq!(q.get("depth"), Some("2"));
        assert_eq!(q.get("flag"), Some(""));
        assert_eq!(q.get("bad"), Some("%zz%4"));
        assert_eq!(q.get("none"), None);
        assert!(Query::parse(None).all("path").is_empty());
    }
}
