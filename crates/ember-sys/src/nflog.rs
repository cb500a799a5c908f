//! The netfilter log socket: packets that an nftables `log group N` statement
//! copies to user space (nfnetlink_log), with the rule's prefix.
//!
//! Protocol, in steps: 1. open a `NETLINK_NETFILTER` socket; 2. send the
//! ULOG subsystem's CONFIG messages: BIND to group N, copy mode PACKET (the
//! first bytes of each packet), queue threshold 1 (deliver each packet at once);
//! each is acknowledged; 3. receive PACKET messages: a netlink header, a
//! `nfgenmsg`, then attributes (prefix, payload, ...). One socket per group
//! per network namespace: a second bind of the same group fails with EBUSY.
use crate::SysError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_PACKET_HDR: u16 = 1;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

/// A bound nfnetlink_log socket.
#[derive(Debug)]
pub struct NflogSocket {
    fd: OwnedFd,
    group: u16,
}

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedPacket {
    /// The `prefix` of the nftables `log` statement that logged it.
    pub prefix: String,
    /// Link-layer protocol (0x0800 IPv4, 0x86dd IPv6).
    pub hw_protocol: u16,
    /// The start of the packet, from the network header on.
    pub payload: Vec<u8>,
}

impl NflogSocket {
    /// Binds log group `group` and asks for the first `copy_bytes` of each packet.
    pub fn bind(group: u16, copy_bytes: u32) -> Result<NflogSocket, SysError> {
        let target = || format!("nflog group {group}");
        // SAFETY: plain socket(2); the result is checked and owned below.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
        if fd < 0 {
            return Err(SysError::last("netlink socket", target()));
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain data; zeroed is a valid value for it.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        let len = std::mem::size_of::<libc::sockaddr_nl>() as u32;
        // SAFETY: sa is a live sockaddr_nl of the length passed.
        if unsafe { libc::bind(fd.as_raw_fd(), (&sa as *const libc::sockaddr_nl).cast(), len) } < 0 {
            return Err(SysError::last("bind netlink", target()));
        }
        let sock = NflogSocket { fd, group };
        sock.set_int(libc::SO_RCVBUF, 1 << 20);
        sock.config(1, &[(NFULA_CFG_CMD, vec![NFULNL_CFG_CMD_BIND])])?;
        let mut mode = copy_bytes.to_be_bytes().to_vec();
        mode.extend([NFULNL_COPY_PACKET, 0]);
        sock.config(
            2,
            &[
                (NFULA_CFG_MODE, mode),
                (NFULA_CFG_QTHRESH, 1u32.to_be_bytes().to_vec()),
                (NFULA_CFG_TIMEOUT, 1u32.to_be_bytes().to_vec()),
            ],
        )?;
        Ok(sock)
    }

    fn set_int(&self, opt: i32, v: i32) {
        // SAFETY: setsockopt with a pointer to a live int of the size passed.
        unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const i32).cast(),
                std::mem::size_of::<i32>() as u32,
            );
        }
    }

    /// How long [`NflogSocket::recv`] waits before returning `Ok(0)`.
    pub fn set_timeout(&self, t: Duration) -> Result<(), SysError> {
        let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
        // SAFETY: setsockopt with a pointer to a live timeval of the size passed.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        if r < 0 {
            return Err(SysError::last("SO_RCVTIMEO", format!("nflog group {}", self.group)));
        }
        Ok(())
    }

    /// Sends one CONFIG message and waits for its acknowledgement.
    fn config(&self, seq: u32, attrs: &[(u16, Vec<u8>)]) -> Result<(), SysError> {
        let target = || format!("nflog group {}", self.group);
        let msg = config_message(seq, self.group, attrs);
        // SAFETY: send from a live buffer of the length passed.
        if unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
            return Err(SysError::last("netlink send", target()));
        }
        let mut buf = [0u8; 512];
        self.set_timeout(Duration::from_secs(2))?;
        let n = self.recv(&mut buf)?;
        match ack_errno(&buf[..n]) {
            Some(0) => Ok(()),
            Some(e) => Err(SysError::new("nflog config", target(), std::io::Error::from_raw_os_error(e))),
            None => Err(SysError::new("nflog config", target(), std::io::Error::other("no acknowledgement"))),
        }
    }

    /// Receives one datagram (any number of messages); `Ok(0)` on timeout.
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize, SysError> {
        // SAFETY: recv into a live buffer of the length passed.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                return Ok(0);
            }
            return Err(SysError::new("netlink recv", format!("nflog group {}", self.group), e));
        }
        Ok(n as usize)
    }
}

fn config_message(seq: u32, group: u16, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![libc::AF_UNSPEC as u8, 0];
    body.extend(group.to_be_bytes());
    for (ty, data) in attrs {
        body.extend(((4 + data.len()) as u16).to_ne_bytes());
        body.extend(ty.to_ne_bytes());
        body.extend(data);
        while body.len() % 4 != 0 {
            body.push(0);
        }
    }
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend(((16 + body.len()) as u32).to_ne_bytes());
    msg.extend(((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG).to_ne_bytes());
    msg.extend((NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend(seq.to_ne_bytes());
    msg.extend(0u32.to_ne_bytes());
    msg.extend(body);
    msg
}

/// The errno of an NLMSG_ERROR acknowledgement (0 = success).
fn ack_errno(buf: &[u8]) -> Option<i32> {
    messages(buf)
        .find(|(ty, _)| *ty == NLMSG_ERROR)
        .and_then(|(_, p)| Some(-i32::from_ne_bytes(p.get(..4)?.try_into().ok()?)))
}

/// (type, payload) of each netlink message in a datagram.
fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        let h = buf.get(off..off + 16)?;
        let len = u32::from_ne_bytes(h[..4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes(h[4..6].try_into().ok()?);
        if len < 16 || off + len > buf.len() {
            return None;
        }
        let payload = &buf[off + 16..off + len];
        off += (len + 3) & !3;
        Some((ty, payload))
    })
}

/// The logged packets in one datagram. Malformed parts are skipped.
pub fn parse(buf: &[u8]) -> Vec<LoggedPacket> {
    let mut out = Vec::new();
    for (ty, p) in messages(buf) {
        if ty != (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET || p.len() < 4 {
            continue;
        }
        let mut pkt = LoggedPacket { prefix: String::new(), hw_protocol: 0, payload: Vec::new() };
        let mut off = 4;
        while let Some(h) = p.get(off..off + 4) {
            let len = u16::from_ne_bytes([h[0], h[1]]) as usize;
            let ty = u16::from_ne_bytes([h[2], h[3]]) & 0x3fff;
            let Some(data) = p.get(off + 4..off + len.max(4)) else { break };
            match ty {
                NFULA_PACKET_HDR if data.len() >= 2 => pkt.hw_protocol = u16::from_be_bytes([data[0], data[1]]),
                NFULA_PAYLOAD => pkt.payload = data.to_vec(),
                NFULA_PREFIX => {
                    pkt.prefix = String::from_utf8_lossy(data.split(|b| *b == 0).next().unwrap_or(&[])).into_owned()
                }
                _ => {}
            }
            off += (len.max(4) + 3) & !3;
        }
        out.push(pkt);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut v = ((4 + data.len()) as u16).to_ne_bytes().to_vec();
        v.extend(ty.to_ne_bytes());
        v.extend(data);
        v.resize(v.len().next_multiple_of(4), 0);
        v
    }

    #[test]
    fn parses_a_packet_message() {
        let mut body = vec![2, 0, 0, 7];
        body.extend(attr(NFULA_PACKET_HDR, &[0x08, 0x00, 1, 0]));
        body.extend(attr(NFULA_PREFIX, b"ember:3:host\0"));
        body.extend(attr(NFULA_PAYLOAD, &[0x45, 0, 0, 20]));
        let mut msg = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
        msg.extend((NFNL_SUBSYS_ULOG << 8).to_ne_bytes());
        msg.extend([0u8; 10]);
        msg.extend(body);
        let pkts = parse(&msg);
        assert_eq!(pkts.len(), 1);
        assert_eq!(pkts[0].prefix, "ember:3:host");
        assert_eq!(pkts[0].hw_protocol, 0x0800);
        assert_eq!(pkts[0].payload, vec![0x45, 0, 0, 20]);
        assert!(parse(&msg[..20]).is_empty(), "a truncated datagram yields nothing");
    }

    #[test]
    fn config_message_layout() {
        let m = config_message(9, 7, &[(NFULA_CFG_CMD, vec![NFULNL_CFG_CMD_BIND])]);
        assert_eq!(u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(&m[18..20], &7u16.to_be_bytes());
        assert_eq!(m.len() % 4, 0);
    }
}
