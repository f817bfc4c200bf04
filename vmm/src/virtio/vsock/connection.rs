//! One vsock stream connection between a guest socket and a host Unix stream, with
//! credit-based flow control in both directions.
//!
//! Guest -> host: we announce `buf_alloc` = [`BUF_ALLOC`]; bytes the host socket does not take
//! at once wait in a buffer that can never exceed it (a guest that overruns its credit is
//! reset). Host -> guest: we read from the host socket only as much as the guest's credit
//! (`peer_buf_alloc - (rx_cnt - peer_fwd_cnt)`) and the RX buffer allow, so nothing is buffered
//! on that side at all.
//!
//! A guest that closes its socket (SHUTDOWN with both flags, what `close()` sends) while some of
//! what it sent still waits for the host socket is not reset at once: the connection lingers,
//! delivering only that buffered data (nothing is read from the host, nothing is sent to the
//! guest), until the buffer is empty (the host then sees EOF) or [`CLOSE_LINGER`] passes. Resetting
//! it at once lost the last bytes a guest wrote before closing, such as the agent's last frame
//! to a host that was a little slow to read.

use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vmm_sys_util::epoll::EventSet;

use super::packet::{HOST_CID, Header, TYPE_STREAM};

/// Receive buffer announced to the guest, and the cap on bytes buffered per connection.
pub const BUF_ALLOC: u32 = 64 * 1024;
/// Send a credit update once this many bytes were forwarded since the last announcement.
pub const CREDIT_UPDATE_THRESHOLD: u32 = BUF_ALLOC / 2;

/// How long a connection the guest closed may linger to deliver what it still buffers for the
/// host (at most [`BUF_ALLOC`] bytes).
pub const CLOSE_LINGER: Duration = Duration::from_secs(10);

/// (host port, guest port).
pub type ConnKey = (u32, u32);

/// Connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Host-initiated: REQUEST sent (or to be sent), waiting for the guest's RESPONSE.
    Connecting,
    /// Data flows.
    Established,
}

/// Guest overran its credit, or the host socket failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// More data than announced credit.
    #[error("guest exceeded its vsock credit")]
    CreditOverrun,
    /// Writing to the host socket failed.
    #[error("host socket write failed")]
    HostWrite,
}

/// A connection.
pub struct Conn {
    /// The host side.
    pub stream: UnixStream,
    /// Epoll token.
    pub token: u64,
    /// State.
    pub state: State,
    /// REQUEST to send (host-initiated).
    pub send_request: bool,
    /// The host client sent bytes right behind its `CONNECT` line, before our `OK` (a real
    /// client sends its first frame at once; a silent flood does not): its `REQUEST` goes
    /// ahead, and it is never pushed out at the cap.
    pub eager: bool,
    /// RESPONSE to send (guest-initiated).
    pub send_response: bool,
    /// CREDIT_UPDATE to send.
    pub send_credit_update: bool,
    /// SHUTDOWN(SEND) to send (host reached EOF).
    pub send_shutdown: bool,
    /// The host side reached EOF.
    pub host_eof: bool,
    /// The guest will send nothing more.
    pub guest_shut_send: bool,
    /// The guest closed the connection (both directions) with data still buffered for the
    /// host: it lingers only to deliver that.
    pub guest_closed: bool,
    /// Host socket (probably) has data: set on EPOLLIN, cleared on EWOULDBLOCK.
    pub readable: bool,
    /// In the muxer's RX work list.
    pub queued: bool,
    /// Events currently registered with epoll (`None` = not registered).
    pub registered: Option<EventSet>,
    tx: VecDeque<u8>,
    host_write_closed: bool,
    fwd_cnt: u32,
    last_fwd_sent: u32,
    rx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
}

impl Conn {
    /// A new connection.
    pub fn new(stream: UnixStream, token: u64, state: State) -> Self {
        Conn {
            stream,
            token,
            state,
            send_request: false,
            eager: false,
            send_response: false,
            send_credit_update: false,
            send_shutdown: false,
            host_eof: false,
            guest_shut_send: false,
            guest_closed: false,
            readable: false,
            queued: false,
            registered: None,
            tx: VecDeque::new(),
            host_write_closed: false,
            fwd_cnt: 0,
            last_fwd_sent: 0,
            rx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
        }
    }

    /// Guest data buffered for the host socket (at most [`BUF_ALLOC`]).
    #[cfg(test)]
    pub fn buffered(&self) -> usize {
        self.tx.len()
    }

    /// Whether every byte the guest sent has been written to the host socket.
    pub fn tx_drained(&self) -> bool {
        self.tx.is_empty()
    }

    /// Bytes the guest can still take.
    pub fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc
            .saturating_sub(self.rx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    /// Learn the guest's credit from any packet it sent.
    pub fn update_peer(&mut self, hdr: &Header) {
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = hdr.fwd_cnt;
    }

    /// Record `n` bytes sent to the guest.
    pub fn sent_to_guest(&mut self, n: u32) {
        self.rx_cnt = self.rx_cnt.wrapping_add(n);
    }

    /// Queue guest data for the host and write what the host takes now.
    pub fn push_tx(&mut self, data: &[u8]) -> Result<(), ConnError> {
        if self.guest_shut_send || self.tx.len() + data.len() > BUF_ALLOC as usize {
            return Err(ConnError::CreditOverrun);
        }
        self.tx.extend(data);
        self.flush_tx()
    }

    /// Write buffered guest data to the host socket.
    pub fn flush_tx(&mut self) -> Result<(), ConnError> {
        while !self.tx.is_empty() {
            let (a, _) = self.tx.as_slices();
            match self.stream.write(a) {
                Ok(0) => return Err(ConnError::HostWrite),
                Ok(n) => {
                    self.tx.drain(..n);
                    self.fwd_cnt = self.fwd_cnt.wrapping_add(n as u32);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Err(ConnError::HostWrite),
            }
        }
        if self.fwd_cnt.wrapping_sub(self.last_fwd_sent) >= CREDIT_UPDATE_THRESHOLD {
            self.send_credit_update = true;
        }
        if self.tx.is_empty() && self.guest_shut_send && !self.host_write_closed {
            self.host_write_closed = true;
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
        Ok(())
    }

    /// Whether a control packet is waiting (never for a connection the guest closed).
    pub fn has_control(&self) -> bool {
        !self.guest_closed
            && (self.send_request
                || self.send_response
                || self.send_credit_update
                || self.send_shutdown)
    }

    /// Whether data could flow to the guest now.
    pub fn can_send_data(&self) -> bool {
        self.state == State::Established
            && !self.guest_closed
            && self.readable
            && !self.host_eof
            && self.peer_credit() > 0
    }

    /// Whether the connection has something for the RX queue.
    pub fn has_rx_work(&self) -> bool {
        self.has_control() || self.can_send_data()
    }

    /// The epoll events this connection needs now (empty = deregister).
    pub fn wanted_events(&self) -> EventSet {
        let mut ev = EventSet::empty();
        if self.state == State::Established
            && !self.guest_closed
            && !self.host_eof
            && !self.readable
            && self.peer_credit() > 0
        {
            ev |= EventSet::IN | EventSet::READ_HANG_UP;
        }
        if !self.tx.is_empty() {
            ev |= EventSet::OUT;
        }
        ev
    }

    /// A header for a packet to the guest; records the forward count it announces.
    pub fn header(
        &mut self,
        key: ConnKey,
        guest_cid: u64,
        op: u16,
        len: u32,
        flags: u32,
    ) -> Header {
        self.last_fwd_sent = self.fwd_cnt;
        Header {
            src_cid: HOST_CID,
            dst_cid: guest_cid,
            src_port: key.0,
            dst_port: key.1,
            len,
            kind: TYPE_STREAM,
            op,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt,
        }
    }
}

/// A header for a packet that belongs to no connection (RST replies).
pub fn bare_header(key: ConnKey, guest_cid: u64, op: u16) -> Header {
    Header {
        src_cid: HOST_CID,
        dst_cid: guest_cid,
        src_port: key.0,
        dst_port: key.1,
        kind: TYPE_STREAM,
        op,
        ..Header::default()
    }
}
