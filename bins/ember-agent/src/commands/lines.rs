//! Splitting command output into lines, and the bounded per-command log.
use std::collections::VecDeque;

/// Longer lines are cut into pieces of at most this many bytes, so one
/// runaway line cannot grow a buffer or an event without bound.
pub const MAX_LINE: usize = 64 * 1024;

/// Bytes in, lines out. Terminators (`\n`, `\r\n`) are stripped; invalid
/// UTF-8 is replaced.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<String>) {
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        loop {
            let rest = &self.buf[start..];
            match rest.iter().position(|&b| b == b'\n') {
                Some(n) if n <= MAX_LINE => {
                    out.push(text(&rest[..n]));
                    start += n + 1;
                }
                _ if rest.len() >= MAX_LINE => {
                    let cut = utf8_cut(rest, MAX_LINE);
                    out.push(text(&rest[..cut]));
                    start += cut;
                }
                _ => break,
            }
        }
        self.buf.drain(..start);
    }

    /// The unterminated tail at end of stream, if any.
    pub fn finish(&mut self, out: &mut Vec<String>) {
        if !self.buf.is_empty() {
            out.push(text(&self.buf));
            self.buf.clear();
        }
    }
}

fn text(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line).into_owned()
}

/// The largest cut point <= `max` that does not split a UTF-8 sequence.
fn utf8_cut(b: &[u8], max: usize) -> usize {
    let mut cut = max;
    // Continuation bytes are 0b10xx_xxxx; a sequence is at most 4 bytes.
    while cut > max - 3 && b.get(cut).is_some_and(|c| c & 0xC0 == 0x80) {
        cut -= 1;
    }
    if b.get(cut).is_some_and(|c| c & 0xC0 == 0x80) {
        max
    } else {
        cut
    }
}

/// The text of a stdout/stderr event for one line: a blank line is sent as
/// "\n" because execd omits empty texts.
pub fn event_text(line: &str) -> String {
    if line.is_empty() {
        "\n".to_string()
    } else {
        line.to_string()
    }
}

/// A command's combined output, bounded in bytes by dropping the oldest
/// lines. Line numbers are absolute (they keep counting past dropped lines),
/// so a client's cursor stays meaningful.
#[derive(Debug)]
pub struct LineLog {
    lines: VecDeque<String>,
    /// Absolute number of the first retained line.
    first: u64,
    bytes: usize,
    cap: usize,
}

impl LineLog {
    pub fn new(cap: usize) -> LineLog {
        LineLog { lines: VecDeque::new(), first: 0, bytes: 0, cap }
    }

    pub fn push(&mut self, line: &str) {
        self.bytes += line.len() + 1;
        self.lines.push_back(line.to_string());
        while self.bytes > self.cap {
            let Some(old) = self.lines.pop_front() else {
                break;
            };
            self.bytes -= old.len() + 1;
            self.first += 1;
        }
    }

    /// Lines after the first `cursor` (all retained lines if `None`), each
    /// with its newline, and the cursor for the next read.
    pub fn since(&self, cursor: Option<u64>) -> (String, u64) {
        let skip = cursor.unwrap_or(0).saturating_sub(self.first) as usize;
        let mut out = String::new();
        for l in self.lines.iter().skip(skip) {
            out.push_str(l);
            out.push('\n');
        }
        (out, self.end())
    }

    /// The absolute number of lines ever written.
    pub fn end(&self) -> u64 {
        self.first + self.lines.len() as u64
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Frees the retained text, keeping the line count.
    pub fn clear(&mut self) {
        self.first = self.end();
        self.lines = VecDeque::new();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut s = LineSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        out
    }

    #[test]
    fn lines_across_chunks_with_crlf_and_tail() {
        assert_eq!(split(&[b"a\r\nb", b"c\n\nd"]), vec!["a", "bc", "", "d"]);
        assert_eq!(split(&[b"x\n"]), vec!["x"]);
        assert_eq!(event_text(""), "\n");
    }

    #[test]
    fn long_lines_are_cut_at_char_boundaries() {
        let long = "a".repeat(MAX_LINE + 10) + "\n";
        let out = split(&[long.as_bytes()]);
        assert_eq!(out.iter().map(String::len).collect::<Vec<_>>(), vec![MAX_LINE, 10]);
        // A 3-byte char straddling the limit moves whole to the next piece.
        let s = "a".repeat(MAX_LINE - 1) + "€b";
        let out = split(&[s.as_bytes()]);
        assert_eq!(out[0].len(), MAX_LINE - 1);
        assert_eq!(out[1], "€b");
    }

    #[test]
    fn log_drops_oldest_and_keeps_absolute_cursors() {
        let mut log = LineLog::new(8);
        for l in ["aaa", "bbb", "ccc"] {
            log.push(l);
        }
        assert_eq!(log.since(None), ("bbb\nccc\n".to_string(), 3));
        assert_eq!(log.since(Some(2)), ("ccc\n".to_string(), 3));
        assert_eq!(log.since(Some(0)), ("bbb\nccc\n".to_string(), 3));
        assert_eq!(log.since(Some(9)), (String::new(), 3));
        log.clear();
        assert_eq!((log.end(), log.bytes()), (3, 0));
    }
}
