//! The vsock event handler: routes TX packets from the guest to connections, fills the RX
//! queue from connections (control packets first, then data in round-robin), accepts host
//! clients on the Unix socket and runs their `CONNECT` handshake.
//!
//! Only the host opens connections: every guest `REQUEST` is answered with `RST` and counted
//! ([`guest_connects_refused`]); nothing on the host is ever connected on the guest's behalf.
//!
//! Bounded everywhere: at most [`MAX_CONNECTIONS`] connections plus pending host clients
//! (beyond that a host client is closed at once), at most
//! [`MAX_QUEUED_RST`] queued bare RST replies, and a host socket is only watched for input while
//! the guest has credit and we have not yet seen it readable, so a guest that posts no RX
//! buffers costs no CPU.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, EventSet};

use super::connection::{Conn, ConnKey, State, bare_header};
use super::packet::{self, HDR_SIZE, Header, MAX_PAYLOAD, PacketError, op};
use super::timers::{Timer, Timers};
use super::unix::{CONNECT_TIMEOUT, Handshake, PendingClient};
use crate::virtio::queue::{self, Buf, QueueError};
use crate::virtio::worker::{Ctx, HANDLER_TOKEN_BASE, Handler};

/// Most connections (established, connecting and pending host clients) per device.
pub const MAX_CONNECTIONS: usize = 1023;
/// Most bare RST replies waiting for RX buffers.
pub const MAX_QUEUED_RST: usize = 1024;
/// `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`.
pub const EVENT_TRANSPORT_RESET: u32 = 0;

const RXQ: usize = 0;
const TXQ: usize = 1;
const EVQ: usize = 2;
const TOKEN_LISTENER: u64 = HANDLER_TOKEN_BASE;
const FIRST_HOST_PORT: u32 = 1 << 30;

/// Guest `REQUEST`s refused so far, over every vsock device of this process.
static GUEST_CONNECTS_REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many guest-initiated connection requests this process's vsock devices refused with RST.
pub fn guest_connects_refused() -> u64 {
    GUEST_CONNECTS_REFUSED.load(Ordering::Relaxed)
}

enum Slot {
    Pending(PendingClient),
    Conn(ConnKey),
}

/// The vsock muxer (one per activated device).
pub struct Muxer {
    guest_cid: u64,
    listener: UnixListener,
    conns: HashMap<ConnKey, Conn>,
    slots: HashMap<u64, Slot>,
    pending: usize,
    rx_ready: VecDeque<ConnKey>,
    rsts: VecDeque<Header>,
    next_token: u64,
    next_host_port: u32,
    scratch: Vec<u8>,
    reset_event_pending: bool,
    timers: Timers,
}

impl Muxer {
    /// A muxer serving `listener` for guest `guest_cid`.
    pub fn new(guest_cid: u64, listener: UnixListener) -> Self {
        Muxer {
            guest_cid,
            listener,
            conns: HashMap::new(),
            slots: HashMap::new(),
            pending: 0,
            rx_ready: VecDeque::new(),
            rsts: VecDeque::new(),
            next_token: TOKEN_LISTENER + 1,
            next_host_port: FIRST_HOST_PORT,
            scratch: vec![0u8; MAX_PAYLOAD as usize],
            reset_event_pending: false,
            timers: Timers::default(),
        }
    }

    fn count(&self) -> usize {
        self.conns.len() + self.pending
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        if self.next_token >= u64::MAX - 2 {
            self.next_token = TOKEN_LISTENER + 1;
        }
        self.next_token
    }

    fn queue_rst(&mut self, key: ConnKey) {
        if self.rsts.len() < MAX_QUEUED_RST {
            self.rsts
                .push_back(bare_header(key, self.guest_cid, op::RST));
        }
    }

    fn enqueue(&mut self, key: ConnKey) {
        if let Some(c) = self.conns.get_mut(&key)
            && !c.queued
            && c.has_rx_work()
        {
            c.queued = true;
            self.rx_ready.push_back(key);
        }
    }

    fn sync_interest(&mut self, key: ConnKey, ctx: &Ctx<'_>) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let want = c.wanted_events();
        let fd = c.stream.as_raw_fd();
        match (c.registered, want.is_empty()) {
            (Some(cur), false) if cur == want => {}
            (Some(_), false) => ctx.epoll_ctl(ControlOperation::Modify, fd, want, c.token),
            (None, false) => ctx.epoll_ctl(ControlOperation::Add, fd, want, c.token),
            (Some(cur), true) => ctx.epoll_ctl(ControlOperation::Delete, fd, cur, c.token),
            (None, true) => {}
        }
        c.registered = (!want.is_empty()).then_some(want);
    }

    /// Drop a connection; `rst` also tells the guest.
    fn remove(&mut self, key: ConnKey, rst: bool) {
        if let Some(c) = self.conns.remove(&key) {
            self.slots.remove(&c.token);
            if rst {
                self.queue_rst(key);
            }
        }
    }

    fn insert_conn(&mut self, key: ConnKey, mut conn: Conn, ctx: &Ctx<'_>) -> u64 {
        let token = self.token();
        conn.token = token;
        self.slots.insert(token, Slot::Conn(key));
        self.conns.insert(key, conn);
        self.sync_interest(key, ctx);
        self.enqueue(key);
        token
    }

    fn accept_all(&mut self, ctx: &Ctx<'_>) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if self.count() >= MAX_CONNECTIONS {
                tracing::debug!("vsock: connection limit reached; refusing host client");
                continue;
            }
            let Ok(p) = PendingClient::new(stream, Instant::now()) else {
                continue;
            };
            let token = self.token();
            ctx.epoll_ctl(
                ControlOperation::Add,
                p.stream.as_raw_fd(),
                EventSet::IN,
                token,
            );
            self.add_timer(p.deadline, Timer::Pending(token));
            self.slots.insert(token, Slot::Pending(p));
            self.pending += 1;
        }
    }

    fn handshake(&mut self, token: u64, ctx: &Ctx<'_>) {
        let Some(Slot::Pending(p)) = self.slots.get_mut(&token) else {
            return;
        };
        let port = match p.advance() {
            Handshake::Incomplete => return,
            Handshake::Drop => None,
            Handshake::Connect(port) => Some(port),
        };
        let Some(Slot::Pending(p)) = self.slots.remove(&token) else {
            return;
        };
        self.pending -= 1;
        let Some(guest_port) = port else {
            return;
        };
        let fd = p.stream.as_raw_fd();
        ctx.epoll_ctl(ControlOperation::Delete, fd, EventSet::IN, token);
        let Some(host_port) = self.alloc_host_port(guest_port) else {
            return;
        };
        let mut conn = Conn::new(p.stream, 0, State::Connecting);
        conn.send_request = true;
        let key = (host_port, guest_port);
        let token = self.insert_conn(key, conn, ctx);
        self.add_timer(
            Instant::now() + CONNECT_TIMEOUT,
            Timer::Connecting(key, token),
        );
    }

    fn timer_live(&self, t: &Timer) -> bool {
        match t {
            Timer::Pending(tok) => matches!(self.slots.get(tok), Some(Slot::Pending(_))),
            Timer::Connecting(key, tok) => self
                .conns
                .get(key)
                .is_some_and(|c| c.token == *tok && c.state == State::Connecting),
        }
    }

    fn add_timer(&mut self, at: Instant, t: Timer) {
        if self.timers.len() >= Timers::CAP {
            let mut timers = std::mem::take(&mut self.timers);
            timers.retain(|t| self.timer_live(t));
            self.timers = timers;
        }
        self.timers.push(at, t);
    }

    fn alloc_host_port(&mut self, guest_port: u32) -> Option<u32> {
        for _ in 0..=MAX_CONNECTIONS {
            let p = self.next_host_port;
            self.next_host_port = self
                .next_host_port
                .checked_add(1)
                .unwrap_or(FIRST_HOST_PORT);
            if !self.conns.contains_key(&(p, guest_port)) {
                return Some(p);
            }
        }
        None
    }

    fn conn_event(&mut self, key: ConnKey, events: EventSet, ctx: &Ctx<'_>) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if events
            .intersects(EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP | EventSet::ERROR)
        {
            c.readable = true;
        }
        if events.contains(EventSet::OUT) && c.flush_tx().is_err() {
            self.remove(key, true);
            return;
        }
        self.sync_interest(key, ctx);
        self.enqueue(key);
    }

    /// Handle one validated packet from the guest; `payload` holds RW data.
    fn guest_packet(&mut self, hdr: &Header, payload: &[u8], ctx: &Ctx<'_>) {
        let key = (hdr.dst_port, hdr.src_port);
        if hdr.op == op::REQUEST {
            self.guest_connect(key);
            return;
        }
        let Some(c) = self.conns.get_mut(&key) else {
            if hdr.op != op::RST {
                self.queue_rst(key);
            }
            return;
        };
        c.update_peer(hdr);
        match hdr.op {
            op::RESPONSE if c.state == State::Connecting => {
                let ok = format!("OK {}\n", key.0);
                if c.stream.write_all(ok.as_bytes()).is_err() {
                    self.remove(key, true);
                    return;
                }
                c.state = State::Established;
            }
            op::RST => {
                self.remove(key, false);
                return;
            }
            op::SHUTDOWN => {
                c.guest_shut_send |= hdr.flags & packet::SHUTDOWN_SEND != 0;
                let both = packet::SHUTDOWN_RCV | packet::SHUTDOWN_SEND;
                if hdr.flags & both == both || c.flush_tx().is_err() {
                    let _ = c.flush_tx();
                    self.remove(key, true);
                    return;
                }
            }
            op::RW if c.state == State::Established => {
                if let Err(e) = c.push_tx(payload) {
                    tracing::debug!("vsock: {e}; resetting connection");
                    self.remove(key, true);
                    return;
                }
            }
            op::CREDIT_UPDATE => {}
            op::CREDIT_REQUEST => c.send_credit_update = true,
            _ => {
                self.remove(key, true);
                return;
            }
        }
        self.sync_interest(key, ctx);
        self.enqueue(key);
    }

    /// A guest `REQUEST`: refused with RST (a request reusing a live key also resets that
    /// connection). Counted; logged only for the first and then every 4096th, as the guest
    /// controls the rate.
    fn guest_connect(&mut self, key: ConnKey) {
        if self.conns.contains_key(&key) {
            self.remove(key, true);
            return;
        }
        let n = GUEST_CONNECTS_REFUSED.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(4096) {
            tracing::info!(
                host_port = key.0,
                refused = n + 1,
                "vsock: guest-initiated connection refused"
            );
        }
        self.queue_rst(key);
    }

    fn process_tx(&mut self, ctx: &mut Ctx<'_>) -> Result<(), QueueError> {
        let mut used = false;
        while let Some(chain) = queue::pop_chain(&mut ctx.queues[TXQ], ctx.mem)? {
            if let Ok(bufs) = &chain.bufs {
                self.tx_chain(bufs, ctx);
            }
            queue::add_used(&mut ctx.queues[TXQ], ctx.mem, chain.head, 0)?;
            used = true;
        }
        if used && queue::needs_notification(&mut ctx.queues[TXQ], ctx.mem) {
            ctx.irq.signal_used();
        }
        Ok(())
    }

    fn tx_chain(&mut self, bufs: &[Buf], ctx: &Ctx<'_>) {
        let mut hb = [0u8; HDR_SIZE];
        let got = queue::read_chain(ctx.mem, bufs, 0, &mut hb);
        let payload_room = queue::readable_len(bufs).saturating_sub(HDR_SIZE as u64);
        match packet::parse_tx(&hb[..got], self.guest_cid, payload_room) {
            Ok(hdr) => {
                let len = if hdr.op == op::RW {
                    hdr.len as usize
                } else {
                    0
                };
                let mut scratch = std::mem::take(&mut self.scratch);
                let n = queue::read_chain(ctx.mem, bufs, HDR_SIZE as u64, &mut scratch[..len]);
                if n == len {
                    self.guest_packet(&hdr, &scratch[..n], ctx);
                }
                self.scratch = scratch;
            }
            Err(PacketError::Short | PacketError::Address) => {
                tracing::debug!("vsock: dropping malformed packet");
            }
            Err(e) => {
                tracing::debug!("vsock: {e}");
                if let Some(h) = packet::Header::parse(&hb[..got]) {
                    let key = (h.dst_port, h.src_port);
                    if self.conns.contains_key(&key) {
                        self.remove(key, true);
                    } else if h.op != op::RST {
                        self.queue_rst(key);
                    }
                }
            }
        }
    }

    /// Fill RX buffers: bare RSTs first, then connections in round-robin.
    fn fill_rx(&mut self, ctx: &mut Ctx<'_>) -> Result<(), QueueError> {
        let mut used = false;
        loop {
            if self.rsts.is_empty() && self.rx_ready.is_empty() {
                break;
            }
            let Some(chain) = queue::pop_chain(&mut ctx.queues[RXQ], ctx.mem)? else {
                break;
            };
            let bufs = match chain.bufs {
                Ok(b) if queue::writable_len(&b) >= HDR_SIZE as u64 => b,
                _ => {
                    queue::add_used(&mut ctx.queues[RXQ], ctx.mem, chain.head, 0)?;
                    used = true;
                    continue;
                }
            };
            let written = match self.rsts.pop_front() {
                Some(h) => queue::write_chain(ctx.mem, &bufs, 0, &h.to_bytes()),
                None => self.conn_packet(&bufs, ctx),
            };
            if written == 0 {
                queue::undo_pop(&mut ctx.queues[RXQ]);
                continue;
            }
            queue::add_used(&mut ctx.queues[RXQ], ctx.mem, chain.head, written as u32)?;
            used = true;
        }
        if used && queue::needs_notification(&mut ctx.queues[RXQ], ctx.mem) {
            ctx.irq.signal_used();
        }
        Ok(())
    }

    /// Write the next packet of the first ready connection into `bufs`; 0 if none was written
    /// (the chain is then put back).
    fn conn_packet(&mut self, bufs: &[Buf], ctx: &Ctx<'_>) -> usize {
        let Some(key) = self.rx_ready.pop_front() else {
            return 0;
        };
        let cid = self.guest_cid;
        let Some(c) = self.conns.get_mut(&key) else {
            return 0;
        };
        let mut written = 0;
        let ctrl = if c.send_request {
            c.send_request = false;
            Some((op::REQUEST, 0))
        } else if c.send_response {
            c.send_response = false;
            Some((op::RESPONSE, 0))
        } else if c.can_send_data() {
            None
        } else if c.send_shutdown {
            c.send_shutdown = false;
            Some((op::SHUTDOWN, packet::SHUTDOWN_SEND))
        } else if c.send_credit_update {
            c.send_credit_update = false;
            Some((op::CREDIT_UPDATE, 0))
        } else {
            c.queued = false;
            return 0;
        };
        match ctrl {
            Some((o, flags)) => {
                let h = c.header(key, cid, o, 0, flags);
                written = queue::write_chain(ctx.mem, bufs, 0, &h.to_bytes());
            }
            None => {
                let room = queue::writable_len(bufs).saturating_sub(HDR_SIZE as u64);
                let n = (c.peer_credit() as usize)
                    .min(self.scratch.len())
                    .min(room as usize);
                if n == 0 {
                    // An RX buffer too small for data: spend it on a credit update.
                    let h = c.header(key, cid, op::CREDIT_UPDATE, 0, 0);
                    c.queued = false;
                    let w = queue::write_chain(ctx.mem, bufs, 0, &h.to_bytes());
                    self.enqueue(key);
                    return w;
                }
                match c.stream.read(&mut self.scratch[..n]) {
                    Ok(0) => {
                        c.host_eof = true;
                        c.send_shutdown = true;
                    }
                    Ok(m) => {
                        c.send_credit_update = false;
                        let h = c.header(key, cid, op::RW, m as u32, 0);
                        let hw = queue::write_chain(ctx.mem, bufs, 0, &h.to_bytes());
                        let dw =
                            queue::write_chain(ctx.mem, bufs, HDR_SIZE as u64, &self.scratch[..m]);
                        c.sent_to_guest(m as u32);
                        written = hw + dw;
                    }
                    Err(e)
                        if e.kind() == ErrorKind::WouldBlock
                            || e.kind() == ErrorKind::Interrupted =>
                    {
                        c.readable = false;
                    }
                    Err(_) => {
                        self.remove(key, true);
                        return 0;
                    }
                }
            }
        }
        c.queued = false;
        self.sync_interest(key, ctx);
        self.enqueue(key);
        written
    }

    fn expire_timers(&mut self) {
        let now = Instant::now();
        while let Some(t) = self.timers.pop_expired(now) {
            if !self.timer_live(&t) {
                continue;
            }
            match t {
                Timer::Pending(tok) => {
                    tracing::debug!("vsock: host client handshake timed out");
                    self.slots.remove(&tok);
                    self.pending -= 1;
                }
                Timer::Connecting(key, _) => {
                    tracing::debug!("vsock: guest did not answer connection to port {}", key.1);
                    self.remove(key, true);
                }
            }
        }
    }

    fn deliver_reset_event(&mut self, ctx: &mut Ctx<'_>) -> Result<(), QueueError> {
        if !self.reset_event_pending {
            return Ok(());
        }
        let Some(chain) = queue::pop_chain(&mut ctx.queues[EVQ], ctx.mem)? else {
            return Ok(());
        };
        let n = match &chain.bufs {
            Ok(b) => queue::write_chain(ctx.mem, b, 0, &EVENT_TRANSPORT_RESET.to_le_bytes()),
            Err(_) => 0,
        };
        if n == 4 {
            self.reset_event_pending = false;
        }
        queue::add_used(&mut ctx.queues[EVQ], ctx.mem, chain.head, n as u32)?;
        ctx.irq.signal_used();
        Ok(())
    }

    fn check(r: Result<(), QueueError>, ctx: &Ctx<'_>) {
        if let Err(e) = r {
            tracing::warn!("vsock: {e}");
            ctx.irq.set_needs_reset();
        }
    }
}

impl Handler for Muxer {
    fn start(&mut self, ctx: &mut Ctx<'_>) {
        let fd = self.listener.as_raw_fd();
        ctx.epoll_ctl(ControlOperation::Add, fd, EventSet::IN, TOKEN_LISTENER);
    }

    fn queue_notify(&mut self, index: usize, ctx: &mut Ctx<'_>) {
        let r = match index {
            TXQ => self.process_tx(ctx).and_then(|()| self.fill_rx(ctx)),
            RXQ => self.fill_rx(ctx),
            EVQ => self.deliver_reset_event(ctx),
            _ => Ok(()),
        };
        Self::check(r, ctx);
    }

    fn fd_event(&mut self, token: u64, events: EventSet, ctx: &mut Ctx<'_>) {
        match self.slots.get(&token) {
            _ if token == TOKEN_LISTENER => self.accept_all(ctx),
            Some(Slot::Pending(_)) => self.handshake(token, ctx),
            Some(Slot::Conn(key)) => {
                let key = *key;
                self.conn_event(key, events, ctx);
            }
            None => {}
        }
        let r = self.fill_rx(ctx);
        Self::check(r, ctx);
    }

    fn deadline(&self) -> Option<Instant> {
        self.timers.next()
    }

    fn timeout(&mut self, ctx: &mut Ctx<'_>) {
        self.expire_timers();
        let r = self.fill_rx(ctx);
        Self::check(r, ctx);
    }

    fn request(&mut self, ctx: &mut Ctx<'_>) {
        tracing::info!(
            "vsock: transport reset; dropping {} connections",
            self.conns.len()
        );
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for k in keys {
            self.remove(k, false);
        }
        self.rx_ready.clear();
        self.rsts.clear();
        self.reset_event_pending = true;
        let r = self.deliver_reset_event(ctx);
        Self::check(r, ctx);
    }
}
