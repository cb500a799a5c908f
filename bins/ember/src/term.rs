//! The local terminal of `ember exec -it`: raw mode for the session's length,
//! its window size, and the detach sequence. Safe wrappers from rustix.
use rustix::termios::{self, OptionalActions, Termios};
use std::os::fd::BorrowedFd;

/// Puts stdin's terminal in raw mode; the previous mode comes back on drop,
/// on every way out of the session (exit, detach, error).
pub struct RawMode {
    saved: Termios,
}

fn stdin_fd() -> BorrowedFd<'static> {
    rustix::stdio::stdin()
}

pub fn stdin_is_tty() -> bool {
    termios::isatty(stdin_fd())
}

impl RawMode {
    pub fn enter() -> std::io::Result<RawMode> {
        let saved = termios::tcgetattr(stdin_fd())?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin_fd(), OptionalActions::Now, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(stdin_fd(), OptionalActions::Now, &self.saved);
    }
}

/// (cols, rows) of stdin's terminal, if it is one and knows its size.
pub fn window_size() -> Option<(u16, u16)> {
    let w = termios::tcgetwinsize(stdin_fd()).ok()?;
    (w.ws_col > 0 && w.ws_row > 0).then_some((w.ws_col, w.ws_row))
}

/// Watches typed input for the detach sequence (docker's `ctrl-p,ctrl-q` by
/// default). Bytes that start the sequence are held back until it is clear
/// whether they complete it; if not, they are passed on as typed.
pub struct DetachKeys {
    seq: Vec<u8>,
    matched: usize,
}

impl DetachKeys {
    /// `ctrl-p,ctrl-q` style: `ctrl-<c>` is that control character, a single
    /// character is itself; empty: no detach sequence.
    pub fn parse(spec: &str) -> Result<DetachKeys, String> {
        let mut seq = Vec::new();
        for key in spec.split(',').filter(|k| !k.is_empty()) {
            let b = match key.strip_prefix("ctrl-") {
                Some(c) if c.len() == 1 && (b'@'..=b'_').contains(&c.as_bytes()[0].to_ascii_uppercase()) => {
                    c.as_bytes()[0].to_ascii_uppercase() & 0x1f
                }
                None if key.len() == 1 && key.is_ascii() => key.as_bytes()[0],
                _ => return Err(format!("--detach-keys: {key:?} is neither ctrl-<letter> nor one character")),
            };
            seq.push(b);
        }
        Ok(DetachKeys { seq, matched: 0 })
    }

    /// What to send on for `input`, and whether the sequence was completed
    /// (anything typed after it in the same read is dropped).
    pub fn feed(&mut self, input: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(input.len());
        for &b in input {
            if self.seq.is_empty() {
                out.push(b);
                continue;
            }
            if b == self.seq[self.matched] {
                self.matched += 1;
                if self.matched == self.seq.len() {
                    self.matched = 0;
                    return (out, true);
                }
                continue;
            }
            // Not the sequence after all: the held bytes were typed input.
            out.extend_from_slice(&self.seq[..self.matched]);
            self.matched = 0;
            if b == self.seq[0] {
                self.matched = 1;
            } else {
                out.push(b);
            }
        }
        (out, false)
    }
}

#[cfg(test)]
mod tests {
    use super::DetachKeys;

    #[test]
    fn the_detach_sequence_is_held_then_dropped_or_passed_on() {
        let mut d = DetachKeys::parse("ctrl-p,ctrl-q").unwrap();
        assert_eq!(d.feed(b"ls\r"), (b"ls\r".to_vec(), false));
        // ctrl-p alone is held; what follows decides.
        assert_eq!(d.feed(b"\x10"), (vec![], false));
        assert_eq!(d.feed(b"x"), (b"\x10x".to_vec(), false));
        assert_eq!(d.feed(b"a\x10\x10"), (b"a\x10".to_vec(), false));
        assert_eq!(d.feed(b"\x11rest"), (vec![], true));
        assert_eq!(d.feed(b"ab\x10\x11"), (b"ab".to_vec(), true));
        let mut none = DetachKeys::parse("").unwrap();
        assert_eq!(none.feed(b"\x10\x11"), (b"\x10\x11".to_vec(), false));
        assert_eq!(DetachKeys::parse("ctrl-a,d").unwrap().seq, vec![1, b'd']);
        assert!(DetachKeys::parse("ctrl-").is_err());
        assert!(DetachKeys::parse("alt-x").is_err());
    }
}
