//! Splitting command output into lines, and the bounded per-command log.
use std::collections::VecDeque;

/// Longer lines are cut into pieces of at most this many bytes, so one
/// runaway line cannot grow a buffer or an event without bound.
pub const MAX_LINE: usize = 64 * 1024;

/// One piece of output: its text (terminator stripped, invalid UTF-8
/// replaced) for the event and the log, and its exact bytes, terminator
/// included, when the text and a newline would not give them back.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    pub text: String,
    pub raw: Option<Vec<u8>>,
}

impl Line {
    /// `bytes` without its `\n`; `terminated` says whether one followed.
    fn new(bytes: &[u8], terminated: bool) -> Line {
        let body = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        let text = String::from_utf8_lossy(body);
        let exact = terminated && body.len() == bytes.len() && matches!(text, std::borrow::Cow::Borrowed(_));
        let raw = (!exact).then(|| [bytes, if terminated { b"\n" } else { b"" }].concat());
        Line { text: text.into_owned(), raw }
    }
}

/// Bytes in, lines out. Terminators (`\n`, `\r\n`) are stripped; invalid
/// UTF-8 is replaced; [`Line::raw`] keeps the bytes where that loses any.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Line>) {
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        loop {
            let rest = &self.buf[start..];
            match rest.iter().position(|&b| b == b'\n') {
                Some(n) if n <= MAX_LINE => {
                    out.push(Line::new(&rest[..n], true));
                    start += n + 1;
                }
                _ if rest.len() >= MAX_LINE => {
                    let cut = utf8_cut(rest, MAX_LINE);
                    out.push(Line::new(&rest[..cut], false));
                    start += cut;
                }
                _ => break,
            }
        }
        self.buf.drain(..start);
    }

    /// The unterminated tail at end of stream, if any.
    pub fn finish(&mut self, out: &mut Vec<Line>) {
        if !self.buf.is_empty() {
            out.push(Line::new(&self.buf, false));
            self.buf.clear();
        }
    }
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

    fn pieces(chunks: &[&[u8]]) -> Vec<Line> {
        let mut s = LineSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        s.finish(&mut out);
        out
    }

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        pieces(chunks).into_iter().map(|l| l.text).collect()
    }

    #[test]
    fn raw_bytes_are_kept_where_the_text_loses_them() {
        let out = pieces(&[b"ok\na\r\n\xff\xfe\n", b"\ntail"]);
        let raw: Vec<Option<&[u8]>> = out.iter().map(|l| l.raw.as_deref()).collect();
        let want: [Option<&[u8]>; 5] = [None, Some(b"a\r\n"), Some(b"\xff\xfe\n"), None, Some(b"tail")];
        assert_eq!(raw, want);
        assert_eq!(out[2].text, "\u{FFFD}\u{FFFD}");
        // Every piece's bytes, joined, are the input.
        let long = [vec![b'x'; MAX_LINE + 3], b"\r".to_vec()].concat();
        let joined: Vec<u8> = pieces(&[&long])
            .iter()
            .flat_map(|l| l.raw.clone().unwrap_or_else(|| [l.text.as_bytes(), b"\n"].concat()))
            .collect();
        assert_eq!(joined, long);
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
