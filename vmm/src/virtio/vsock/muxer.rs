//! The vsock event handler: routes TX packets from the guest to connections, fills the RX
//! queue from connections (control packets first, then data in round-robin), accepts host
//! clients on the Unix socket and runs their `CONNECT` handshake.
//!
//! Only the host opens connections: every guest `REQUEST` is answered with `RST` and counted
//! ([`guest_connects_refused`]); nothing on the host is ever connected on the guest's behalf.
//!
//! Bounded everywhere: at most [`MAX_CONNECTIONS`] connections plus pending host clients
//! (beyond that a new host client replaces the oldest silent one: one still sending its
//! `CONNECT` line, else one whose `REQUEST` has not gone out and that sent nothing behind its
//! line, else, for a client that sent its first bytes with its line, a connection the guest
//! accepted and has sent nothing on since, or one whose `REQUEST` it has not answered yet and
//! whose client sent nothing with its line; it is closed at once when none of these is
//! left), at most
//! [`MAX_QUEUED_RST`] queued bare RST replies, a connection the guest closed lingers at most
//! `connection::CLOSE_LINGER` to deliver what it still buffers, and a host socket is only watched for input while
//! the guest has credit and we have not yet seen it readable, so a guest that posts no RX
//! buffers costs no CPU.
//!
//! RX buffers go to two queues in turn: connections that carry traffic (data, credit,
//! shutdowns, responses) and new connections' `REQUEST`s. A flood of new connections then
//! cannot hold back the traffic of those already made (a client's first bytes, its `Hello`
//! to the agent, wait behind one `REQUEST` at most, not behind every one queued), and busy
//! streams cannot hold back new connections either. Among new connections, those whose
//! client sent its first bytes right behind the `CONNECT` line (as the agent client does)
//! go first: a real client is not queued behind a flood of silent ones. And the traffic of
//! quiet connections (the guest accepted them and has sent nothing since, their client sent
//! nothing with its line: a silent flood's, when it closes) gets one traffic turn in
//! [`QUIET_EVERY`], so a thousand of them closing at once delay a real client's `Hello` by a
//! few packets, not a thousand.
//!
//! Split by direction: `host` (host clients, handshakes, socket events), `guest` (the TX
//! queue), `rx` (the RX and event queues); this file holds the state and the worker glue.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, EventSet};

use super::connection::{CLOSE_LINGER, Conn, ConnKey, State, bare_header};
use super::packet::{self, HDR_SIZE, Header, MAX_PAYLOAD, PacketError, op};
use super::timers::{Timer, Timers};
use super::transport::VsockQueues;
use super::unix::{Handshake, PendingClient, RESPONSE_TIMEOUT};
use crate::virtio::queue::{self, Buf, QueueError};
use crate::virtio::worker::{Ctx, HANDLER_TOKEN_BASE, Handler};

#[cfg(test)]
mod flood_tests;
mod guest;
mod host;
#[cfg(test)]
mod props;
mod rx;

/// Most connections (established, connecting and pending host clients) per device; a
/// process with fewer descriptors than that plus its own asks for less
/// ([`Muxer::with_max_connections`]).
pub const MAX_CONNECTIONS: usize = vm_vmm_protocol::layout::VSOCK_MAX_CONNECTIONS;
/// Most host clients accepted per listener event (see `host`).
pub const ACCEPT_BATCH: usize = 64;
/// Most bare RST replies waiting for RX buffers.
pub const MAX_QUEUED_RST: usize = 1024;
/// Of the RX buffers that go to connections' traffic, quiet connections get one in this many
/// when others have traffic too (see [`Muxer`]'s module docs).
pub const QUIET_EVERY: u32 = 4;
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
    /// Connections with traffic for the RX queue (round-robin).
    rx_ready: VecDeque<ConnKey>,
    /// The same, of quiet connections: the guest accepted them and has sent nothing since,
    /// and their client sent nothing with its line (a silent flood's, closing).
    rx_quiet: VecDeque<ConnKey>,
    /// Traffic turns taken, for [`QUIET_EVERY`].
    traffic_turns: u32,
    /// New connections whose `REQUEST` waits for an RX buffer: those whose client already
    /// sent its first bytes ([`Conn::eager`]) first, then the others, each in arrival order.
    rx_eager: VecDeque<ConnKey>,
    rx_new: VecDeque<ConnKey>,
    /// Whose turn the next RX buffer is: `rx_new`'s when true (see the module docs).
    new_turn: bool,
    /// Connections the guest accepted and has sent nothing on yet, oldest (lowest token)
    /// first: what a host client at the connection cap may push out.
    silent: BTreeMap<u64, ConnKey>,
    /// Connections whose `REQUEST` went out and the guest has not answered yet, whose client
    /// sent nothing with its line, oldest first: what a host client that spoke at once may
    /// push out at the cap when no silent one is left.
    waiting: BTreeMap<u64, ConnKey>,
    /// A host client accepted over the cap before it sent anything, held one past the cap
    /// until it speaks (its event), another such client arrives, or its deadline passes, and
    /// judged then (see `muxer/host.rs`).
    deferred: Option<u64>,
    rsts: VecDeque<Header>,
    next_token: u64,
    next_host_port: u32,
    scratch: Vec<u8>,
    reset_event_pending: bool,
    /// A transport reset event was delivered and the driver has not yet posted an event
    /// buffer again: until it does, no `REQUEST` goes to the guest (see [`Muxer::transport_reset`]).
    reset_unacked: bool,
    timers: Timers,
    max_conns: usize,
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
            rx_quiet: VecDeque::new(),
            traffic_turns: 0,
            rx_eager: VecDeque::new(),
            rx_new: VecDeque::new(),
            new_turn: false,
            silent: BTreeMap::new(),
            waiting: BTreeMap::new(),
            deferred: None,
            rsts: VecDeque::new(),
            next_token: TOKEN_LISTENER + 1,
            next_host_port: FIRST_HOST_PORT,
            scratch: vec![0u8; MAX_PAYLOAD as usize],
            reset_event_pending: false,
            reset_unacked: false,
            timers: Timers::default(),
            max_conns: MAX_CONNECTIONS,
        }
    }

    /// Caps connections at `max` (never above [`MAX_CONNECTIONS`]): a process whose descriptor
    /// limit leaves room for fewer sets this, so connections alone never reach that limit.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_conns = max.min(MAX_CONNECTIONS);
        self
    }

    /// The connection cap in force.
    pub fn max_connections(&self) -> usize {
        self.max_conns
    }

    /// Host clients and connections held now.
    pub fn connections(&self) -> usize {
        self.count()
    }

    fn count(&self) -> usize {
        self.conns.len() + self.pending
    }

    /// The deferred host client, while it is still a pending one.
    fn deferred_live(&self) -> Option<u64> {
        self.deferred
            .filter(|t| matches!(self.slots.get(t), Some(Slot::Pending(_))))
    }

    /// Whether there is a connection more than the cap allows (the deferred client's place
    /// past it counted as allowed).
    fn over_cap(&self) -> bool {
        self.count() > self.max_conns + usize::from(self.deferred_live().is_some())
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
            let quiet = !c.eager && self.silent.contains_key(&c.token);
            match (c.send_request, c.eager) {
                (true, true) => self.rx_eager.push_back(key),
                (true, false) => self.rx_new.push_back(key),
                (false, _) if quiet => self.rx_quiet.push_back(key),
                (false, _) => self.rx_ready.push_back(key),
            }
        }
    }

    /// The next connection to get an RX buffer: traffic and new connections in turn (see the
    /// module docs), eager new connections before the others, and quiet connections' traffic
    /// on one traffic turn in [`QUIET_EVERY`] (or when no other has any).
    fn next_ready(&mut self) -> Option<ConnKey> {
        let any_new = !self.rx_eager.is_empty() || !self.rx_new.is_empty();
        let any_traffic = !self.rx_ready.is_empty() || !self.rx_quiet.is_empty();
        let new = any_new && (self.new_turn || !any_traffic);
        self.new_turn = !new;
        if new {
            return self
                .rx_eager
                .pop_front()
                .or_else(|| self.rx_new.pop_front());
        }
        self.traffic_turns = self.traffic_turns.wrapping_add(1);
        if (self.traffic_turns.is_multiple_of(QUIET_EVERY) || self.rx_ready.is_empty())
            && let Some(key) = self.rx_quiet.pop_front()
        {
            return Some(key);
        }
        self.rx_ready.pop_front()
    }

    /// Whether a connection is waiting for an RX buffer.
    fn conns_queued(&self) -> bool {
        !self.rx_ready.is_empty()
            || !self.rx_quiet.is_empty()
            || !self.rx_eager.is_empty()
            || !self.rx_new.is_empty()
    }

    fn sync_interest(&mut self, key: ConnKey, ctx: &dyn VsockQueues) {
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
            self.silent.remove(&c.token);
            self.waiting.remove(&c.token);
            if c.queued {
                // Never leave a dead key queued: a connection made again under the same key
                // would be queued twice, and keys of dead connections would pile up while the
                // guest posts no RX buffers (at most MAX_CONNECTIONS entries to scan).
                self.rx_ready.retain(|k| *k != key);
                self.rx_quiet.retain(|k| *k != key);
                self.rx_eager.retain(|k| *k != key);
                self.rx_new.retain(|k| *k != key);
            }
            if rst {
                self.queue_rst(key);
            }
        }
    }

    fn insert_conn(&mut self, key: ConnKey, mut conn: Conn, ctx: &dyn VsockQueues) -> u64 {
        let token = self.token();
        conn.token = token;
        self.slots.insert(token, Slot::Conn(key));
        self.conns.insert(key, conn);
        self.sync_interest(key, ctx);
        self.enqueue(key);
        token
    }

    fn timer_live(&self, t: &Timer) -> bool {
        match t {
            Timer::Pending(tok) => matches!(self.slots.get(tok), Some(Slot::Pending(_))),
            Timer::Connecting(key, tok) => self
                .conns
                .get(key)
                .is_some_and(|c| c.token == *tok && c.state == State::Connecting),
            Timer::Closing(key, tok) => self
                .conns
                .get(key)
                .is_some_and(|c| c.token == *tok && c.guest_closed),
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

    /// Drops every connection, telling the guest nothing (its driver is being reset); host
    /// clients still sending their `CONNECT` line stay.
    pub fn drop_all(&mut self) {
        tracing::info!(
            "vsock: transport reset; dropping {} connections",
            self.conns.len()
        );
        let keys: Vec<ConnKey> = self.conns.keys().copied().collect();
        for k in keys {
            self.remove(k, false);
        }
        self.rx_ready.clear();
        self.rx_quiet.clear();
        self.rx_eager.clear();
        self.rx_new.clear();
        self.rsts.clear();
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
                Timer::Closing(key, _) => {
                    tracing::debug!(
                        "vsock: host did not take what the guest sent before closing port {}",
                        key.1
                    );
                    self.remove(key, true);
                }
            }
        }
    }

    fn check(r: Result<(), QueueError>, ctx: &dyn VsockQueues) {
        if let Err(e) = r {
            crate::warn_limited!(ctx.metrics(), "vsock: {e}");
            ctx.set_needs_reset();
        }
    }

    /// Starts watching the listening socket.
    pub fn start_io(&mut self, ctx: &mut dyn VsockQueues) {
        let fd = self.listener.as_raw_fd();
        ctx.epoll_ctl(ControlOperation::Add, fd, EventSet::IN, TOKEN_LISTENER);
    }

    /// The driver notified queue `index`.
    pub fn queue_event(&mut self, index: usize, ctx: &mut dyn VsockQueues) {
        let r = match index {
            TXQ => self.process_tx(ctx).and_then(|()| self.fill_rx(ctx)),
            RXQ => self.fill_rx(ctx),
            EVQ => self.event_queue_notified(ctx),
            _ => Ok(()),
        };
        Self::check(r, ctx);
    }

    /// The driver posted event buffers: the pending reset event goes out, or, the event being
    /// out, this is the driver's acknowledgement (see [`Muxer::transport_reset`]).
    fn event_queue_notified(&mut self, ctx: &mut dyn VsockQueues) -> Result<(), QueueError> {
        if self.reset_event_pending {
            return self.deliver_reset_event(ctx);
        }
        if self.reset_unacked {
            self.reset_unacked = false;
            tracing::debug!("vsock: the driver handled the transport reset; connecting again");
            return self.fill_rx(ctx);
        }
        Ok(())
    }

    /// Whether the guest handled the last transport reset (always, when there was none).
    pub fn reset_acknowledged(&self) -> bool {
        !self.reset_unacked
    }

    /// One of the muxer's descriptors (epoll `token`) is ready.
    pub fn socket_event(&mut self, token: u64, events: EventSet, ctx: &mut dyn VsockQueues) {
        match self.slots.get(&token) {
            _ if token == TOKEN_LISTENER => self.accept_all(ctx),
            Some(Slot::Pending(_)) => self.pending_event(token, ctx),
            Some(Slot::Conn(key)) => {
                let key = *key;
                self.conn_event(key, events, ctx);
            }
            None => {}
        }
        let r = self.fill_rx(ctx);
        Self::check(r, ctx);
    }

    /// The earliest deadline at which [`Muxer::expire`] must run.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Deadlines passed: drops late host clients and unanswered connections.
    pub fn expire(&mut self, ctx: &mut dyn VsockQueues) {
        self.expire_timers();
        let r = self.fill_rx(ctx);
        Self::check(r, ctx);
    }

    /// A transport reset: every connection dropped, the guest told by an event.
    ///
    /// A host client that connects right after it must not reach the guest before the guest
    /// has handled the event: Linux resets every connected socket when it does, and tells the
    /// host nothing, so a connection it accepted just before (a `REQUEST` taken from the RX
    /// queue ahead of the event) would be dropped in the guest and left open on the host, its
    /// client waiting for an answer that never comes (a restored VM's first agent connection
    /// did this). So `REQUEST`s wait until the driver posts an event buffer again, which
    /// Linux's event work does only after resetting its sockets; a connection still waiting
    /// then is dropped after the usual `RESPONSE_TIMEOUT`.
    pub fn transport_reset(&mut self, ctx: &mut dyn VsockQueues) {
        self.drop_all();
        self.reset_event_pending = true;
        self.reset_unacked = true;
        let r = self.deliver_reset_event(ctx);
        Self::check(r, ctx);
    }
}

impl Handler for Muxer {
    fn start(&mut self, ctx: &mut Ctx<'_>) {
        self.start_io(ctx);
    }

    fn queue_notify(&mut self, index: usize, ctx: &mut Ctx<'_>) {
        self.queue_event(index, ctx);
    }

    fn fd_event(&mut self, token: u64, events: EventSet, ctx: &mut Ctx<'_>) {
        self.socket_event(token, events, ctx);
    }

    fn deadline(&self) -> Option<Instant> {
        self.next_deadline()
    }

    fn timeout(&mut self, ctx: &mut Ctx<'_>) {
        self.expire(ctx);
    }

    fn request(&mut self, ctx: &mut Ctx<'_>) {
        self.transport_reset(ctx);
    }
}
