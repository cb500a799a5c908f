//! `multipart/form-data` request bodies (RFC 7578), for execd's file upload:
//! a fresh random boundary that occurs in no part, and field and file names
//! escaped the way browsers do, so a name with `"` or a line break cannot end
//! its header early.
use memchr::memmem;

/// One part: a form field carrying a file.
pub struct Part<'a> {
    pub name: &'a str,
    pub filename: &'a str,
    pub content_type: &'a str,
    pub data: &'a [u8],
}

/// The body of `parts` and its `Content-Type` header value.
pub fn encode(parts: &[Part<'_>]) -> (Vec<u8>, String) {
    let boundary = loop {
        let b = random_boundary();
        // A part that held the delimiter would end early: draw again.
        if !parts.iter().any(|p| memmem::find(p.data, b.as_bytes()).is_some()) {
            break b;
        }
    };
    let mut body = Vec::with_capacity(parts.iter().map(|p| p.data.len() + 200).sum::<usize>() + 64);
    for p in parts {
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
            escape(p.name),
            escape(p.filename),
            p.content_type
        );
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(p.data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (body, format!("multipart/form-data; boundary={boundary}"))
}

/// A name inside a quoted header parameter: `"`, CR and LF percent-escaped
/// (the WHATWG HTML form-data encoding; RFC 7578 §4.2 leaves it to the sender).
fn escape(name: &str) -> String {
    name.replace('"', "%22").replace('\r', "%0D").replace('\n', "%0A")
}

/// `ember-` and 32 hex digits from the OS's CSPRNG. Unpredictable, so a file
/// cannot be crafted to contain it; [`encode`] still checks.
fn random_boundary() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No CSPRNG (never on Linux >= 3.17): the check in `encode` still
        // keeps the boundary out of the data.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        b = (t.as_nanos() ^ u128::from(std::process::id())).to_le_bytes();
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("ember-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part<'a>(filename: &'a str, data: &'a [u8]) -> Part<'a> {
        Part { name: "file", filename, content_type: "application/octet-stream", data }
    }

    #[test]
    fn boundaries_are_fresh_and_never_in_the_data() {
        let (a, ct_a) = encode(&[part("a", b"x")]);
        let (_, ct_b) = encode(&[part("a", b"x")]);
        assert_ne!(ct_a, ct_b);
        let boundary = ct_a.strip_prefix("multipart/form-data; boundary=").unwrap();
        assert_eq!(boundary.len(), "ember-".len() + 32);
        assert!(a.ends_with(format!("\r\n--{boundary}--\r\n").as_bytes()));
    }

    #[test]
    fn names_cannot_break_out_of_their_quotes() {
        let (body, _) = encode(&[part("a\"b\r\nX-Evil: 1", b"x")]);
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("filename=\"a%22b%0D%0AX-Evil: 1\""), "{text}");
        assert!(!text.contains("\r\nX-Evil"), "{text}");
    }
}
