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
        // `application/x-www-form-urlencoded`: `+` is a space, `%XX` a byte,
        // malformed escapes are kept literally, bad UTF-8 replaced.
        let pairs = form_urlencoded::parse(raw.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
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
