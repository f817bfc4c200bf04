//! A minimal guest-side vsock stack on top of [`Driver`], for tests: it posts RX buffers,
//! answers connection requests on listened ports, keeps credit accounting both ways, and can
//! echo everything it receives.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::time::Duration;

use super::{Driver, Seg};
use crate::virtio::vsock::packet::{
    HDR_SIZE, HOST_CID, Header, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM, op,
};
use crate::virtio::{DeviceConfig, VirtioError};

const RXQ: usize = 0;
const TXQ: usize = 1;
/// Payload per packet the guest sends and per RX buffer.
pub const CHUNK: usize = 16 * 1024;
/// Receive buffer the guest announces.
pub const GUEST_BUF_ALLOC: u32 = 256 * 1024;
const RX_BUFS: usize = 128;
const TX_SLOTS: usize = 128;

/// (guest port, host port).
pub type GKey = (u32, u32);

/// Guest-side connection state.
#[derive(Debug, Default)]
pub struct GConn {
    /// RESPONSE seen (or sent).
    pub established: bool,
    /// Bytes received (when not echoing).
    pub inbox: Vec<u8>,
    /// Bytes waiting to be sent.
    pub outbox: VecDeque<u8>,
    /// Total bytes received.
    pub received: u64,
    /// The host said it sends no more.
    pub peer_shutdown: bool,
    /// SHUTDOWN(SEND) was sent (a half-close: the guest still receives).
    pub shut_send_sent: bool,
    close_after_flush: bool,
    shut_send_after_flush: bool,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    tx_cnt: u32,
    fwd_cnt: u32,
    last_fwd_sent: u32,
}

impl GConn {
    fn credit(&self) -> u32 {
        self.peer_buf_alloc
            .saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }
}

/// The fake guest.
pub struct VsockGuest {
    /// The driver.
    pub d: Driver,
    /// Guest CID.
    pub cid: u64,
    /// Open connections.
    pub conns: HashMap<GKey, GConn>,
    /// Every (guest port, host port) the host sent RST for.
    pub resets: Vec<GKey>,
    /// Echo received data back instead of keeping it.
    pub echo: bool,
    /// Transport-reset events seen.
    pub transport_resets: u32,
    /// Leave the event queue alone in [`VsockGuest::pump`] (a driver that has not yet run its
    /// event work): a transport reset event stays unhandled and no event buffer is posted.
    pub hold_events: bool,
    /// Leave host connection requests unanswered (no RESPONSE, no RST).
    pub ignore_requests: bool,
    /// Receive buffer announced to the host (default [`GUEST_BUF_ALLOC`]).
    pub buf_alloc: u32,
    listening: HashSet<u32>,
    rx_addr: HashMap<u16, u64>,
    tx_free: Vec<u64>,
    tx_inflight: HashMap<u16, u64>,
    next_port: u32,
    ev_addr: u64,
}

impl VsockGuest {
    /// Build and activate a vsock device and post RX buffers.
    pub fn new(cid: u64, uds_path: &Path) -> Result<Self, VirtioError> {
        let mut d = Driver::new(&DeviceConfig::Vsock {
            guest_cid: cid,
            uds_path: uds_path.into(),
        })?;
        d.activate(0);
        let tx_free = (0..TX_SLOTS)
            .map(|_| d.alloc((HDR_SIZE + CHUNK) as u64))
            .collect();
        let ev_addr = d.alloc(8);
        let mut g = VsockGuest {
            d,
            cid,
            conns: HashMap::new(),
            resets: Vec::new(),
            echo: false,
            transport_resets: 0,
            hold_events: false,
            buf_alloc: GUEST_BUF_ALLOC,
            ignore_requests: false,
            listening: HashSet::new(),
            rx_addr: HashMap::new(),
            tx_free,
            tx_inflight: HashMap::new(),
            next_port: 50_000,
            ev_addr,
        };
        for _ in 0..RX_BUFS {
            let a = g.d.alloc((HDR_SIZE + CHUNK) as u64);
            g.post_rx(a);
        }
        g.d.add_chain(2, &[Seg::writable(ev_addr, 8)]);
        g.d.notify(2);
        g.d.notify(RXQ as u32);
        Ok(g)
    }

    /// Snapshot the device and restore it into a fresh one on `uds_path` over a copy of the
    /// guest memory, this guest carrying on with it (the old device is dropped).
    pub fn snapshot_restore(&mut self, uds_path: &Path) -> Result<(), crate::virtio::PersistError> {
        let state = self.d.save()?;
        let cfg = DeviceConfig::Vsock {
            guest_cid: self.cid,
            uds_path: uds_path.into(),
        };
        self.d = self.d.restore_copy(&cfg, &state)?;
        Ok(())
    }

    fn post_rx(&mut self, addr: u64) {
        let head = self
            .d
            .add_chain(RXQ, &[Seg::writable(addr, (HDR_SIZE + CHUNK) as u32)]);
        self.rx_addr.insert(head, addr);
    }

    /// Accept host connections to `port`.
    pub fn listen(&mut self, port: u32) {
        self.listening.insert(port);
    }

    /// Open a connection to host `port`; returns its key (RESPONSE or RST arrives via `pump`).
    pub fn connect(&mut self, port: u32) -> GKey {
        self.next_port += 1;
        let key = (self.next_port, port);
        self.conns.insert(key, GConn::default());
        self.send(key, op::REQUEST, 0, &[]);
        key
    }

    /// Queue data on a connection.
    pub fn write(&mut self, key: GKey, data: &[u8]) {
        if let Some(c) = self.conns.get_mut(&key) {
            c.outbox.extend(data);
        }
    }

    /// Half-close a connection after its outbox is sent: SHUTDOWN with only the SEND flag
    /// (what `shutdown(SHUT_WR)` on a guest vsock socket sends); data still flows to the guest.
    pub fn shutdown_send(&mut self, key: GKey) {
        if let Some(c) = self.conns.get_mut(&key) {
            c.shut_send_after_flush = true;
        }
    }

    /// Close a connection after its outbox is sent.
    pub fn close(&mut self, key: GKey) {
        if let Some(c) = self.conns.get_mut(&key) {
            c.close_after_flush = true;
        }
    }

    /// Post a raw packet (header fields filled by the caller) with `payload`; false if no slot.
    pub fn send_raw(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        let Some(addr) = self.tx_free.pop() else {
            return false;
        };
        self.d.write_mem(addr, &hdr.to_bytes());
        self.d.write_mem(addr + HDR_SIZE as u64, payload);
        let len = (HDR_SIZE + payload.len()) as u32;
        let head = self.d.add_chain(TXQ, &[Seg::readable(addr, len)]);
        self.tx_inflight.insert(head, addr);
        self.d.notify(TXQ as u32);
        true
    }

    /// Post a raw packet whose payload is spread over several descriptors, the way Linux
    /// queues a nonlinear skb: `layout[0]` payload bytes share the header's descriptor (0 =
    /// the header alone), then one descriptor per further entry. The entries must add up to
    /// `payload.len()`. Uses fresh harness memory (never reused). False if the TX queue lacks
    /// descriptors.
    pub fn send_raw_split(&mut self, hdr: &Header, payload: &[u8], layout: &[usize]) -> bool {
        assert_eq!(
            layout.iter().sum::<usize>(),
            payload.len(),
            "layout does not cover the payload"
        );
        if layout.is_empty() || self.d.free_descs(TXQ) < layout.len() {
            return false;
        }
        let mut segs = Vec::with_capacity(layout.len());
        let mut off = 0;
        for (i, &n) in layout.iter().enumerate() {
            let head = if i == 0 { HDR_SIZE } else { 0 };
            let addr = self.d.alloc((head + n) as u64);
            if i == 0 {
                self.d.write_mem(addr, &hdr.to_bytes());
            }
            self.d.write_mem(addr + head as u64, &payload[off..off + n]);
            off += n;
            segs.push(Seg::readable(addr, (head + n) as u32));
        }
        self.d.add_chain(TXQ, &segs);
        self.d.notify(TXQ as u32);
        true
    }

    /// The header the guest would send on `key` now (credit fields filled in).
    pub fn header_for(&self, key: GKey, o: u16, len: u32) -> Header {
        Header {
            src_cid: self.cid,
            dst_cid: HOST_CID,
            src_port: key.0,
            dst_port: key.1,
            len,
            kind: TYPE_STREAM,
            op: o,
            flags: 0,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.conns.get(&key).map_or(0, |c| c.fwd_cnt),
        }
    }

    fn send(&mut self, key: GKey, o: u16, flags: u32, payload: &[u8]) -> bool {
        let (fwd_cnt, len) = match self.conns.get_mut(&key) {
            Some(c) => {
                c.last_fwd_sent = c.fwd_cnt;
                (c.fwd_cnt, payload.len() as u32)
            }
            None => (0, payload.len() as u32),
        };
        let hdr = Header {
            src_cid: self.cid,
            dst_cid: HOST_CID,
            src_port: key.0,
            dst_port: key.1,
            len,
            kind: TYPE_STREAM,
            op: o,
            flags,
            buf_alloc: self.buf_alloc,
            fwd_cnt,
        };
        self.send_raw(&hdr, payload)
    }

    /// Process completions and send what credit allows; waits up to `wait` for an interrupt.
    pub fn pump(&mut self, wait: Duration) {
        self.d.wait_irq(wait);
        while let Some((head, _)) = self.d.try_used(TXQ) {
            if let Some(a) = self.tx_inflight.remove(&head) {
                self.tx_free.push(a);
            }
        }
        if !self.hold_events && self.d.try_used(2).is_some() {
            let id = u32::from_le_bytes(
                self.d
                    .read_mem(self.ev_addr, 4)
                    .try_into()
                    .unwrap_or([9; 4]),
            );
            if id == 0 {
                self.transport_resets += 1;
                self.conns.clear();
            }
            self.d.add_chain(2, &[Seg::writable(self.ev_addr, 8)]);
            self.d.notify(2);
        }
        let mut reposted = false;
        while let Some((head, len)) = self.d.try_used(RXQ) {
            let Some(addr) = self.rx_addr.remove(&head) else {
                continue;
            };
            let raw = self.d.read_mem(addr, (len as usize).min(HDR_SIZE + CHUNK));
            if let Some(h) = Header::parse(&raw) {
                let end = (HDR_SIZE + h.len as usize).min(raw.len());
                self.handle(&h, &raw[HDR_SIZE.min(end)..end]);
            }
            self.post_rx(addr);
            reposted = true;
        }
        if reposted {
            self.d.notify(RXQ as u32);
        }
        self.flush();
    }

    fn handle(&mut self, h: &Header, payload: &[u8]) {
        let key = (h.dst_port, h.src_port);
        if h.op == op::REQUEST {
            if self.ignore_requests {
                return;
            }
            if self.listening.contains(&h.dst_port) && !self.conns.contains_key(&key) {
                let c = GConn {
                    established: true,
                    peer_buf_alloc: h.buf_alloc,
                    peer_fwd_cnt: h.fwd_cnt,
                    ..Default::default()
                };
                self.conns.insert(key, c);
                self.send(key, op::RESPONSE, 0, &[]);
            } else {
                self.send(key, op::RST, 0, &[]);
            }
            return;
        }
        if h.op == op::RST {
            self.resets.push(key);
        }
        let echo = self.echo;
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        c.peer_buf_alloc = h.buf_alloc;
        c.peer_fwd_cnt = h.fwd_cnt;
        match h.op {
            op::RESPONSE => c.established = true,
            op::RW => {
                c.received += payload.len() as u64;
                c.fwd_cnt = c.fwd_cnt.wrapping_add(payload.len() as u32);
                if echo {
                    c.outbox.extend(payload)
                } else {
                    c.inbox.extend_from_slice(payload)
                }
            }
            op::SHUTDOWN => {
                c.peer_shutdown = true;
                if echo {
                    c.close_after_flush = true;
                }
            }
            op::RST => {
                self.conns.remove(&key);
            }
            op::CREDIT_REQUEST => {
                self.send(key, op::CREDIT_UPDATE, 0, &[]);
            }
            _ => {}
        }
    }

    fn flush(&mut self) {
        let buf_alloc = self.buf_alloc;
        let keys: Vec<GKey> = self.conns.keys().copied().collect();
        for key in keys {
            while let Some(c) = self.conns.get_mut(&key) {
                if !c.established {
                    break;
                }
                let n = (c.credit() as usize).min(CHUNK).min(c.outbox.len());
                if n == 0 {
                    let needs_update = c.fwd_cnt.wrapping_sub(c.last_fwd_sent) >= buf_alloc / 4;
                    let close = c.close_after_flush && c.outbox.is_empty();
                    let half_close =
                        c.shut_send_after_flush && !c.shut_send_sent && c.outbox.is_empty();
                    if needs_update {
                        self.send(key, op::CREDIT_UPDATE, 0, &[]);
                    }
                    if half_close
                        && self.send(key, op::SHUTDOWN, SHUTDOWN_SEND, &[])
                        && let Some(c) = self.conns.get_mut(&key)
                    {
                        c.shut_send_sent = true;
                    }
                    if close && self.send(key, op::SHUTDOWN, SHUTDOWN_RCV | SHUTDOWN_SEND, &[]) {
                        self.conns.remove(&key);
                    }
                    break;
                }
                if self.tx_free.is_empty() {
                    return;
                }
                let chunk: Vec<u8> = c.outbox.drain(..n).collect();
                c.tx_cnt = c.tx_cnt.wrapping_add(n as u32);
                self.send(key, op::RW, 0, &chunk);
            }
        }
    }
}
