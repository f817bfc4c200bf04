//! The host side of the muxer: accepting host clients on the Unix socket, their `CONNECT`
//! handshake (bounded by the connection limit and a deadline), host port allocation, and
//! readiness events on established connections' sockets.
//!
//! At the connection cap a new host client takes the slot of the oldest one still silent
//! rather than being refused: first a client with no complete `CONNECT` line yet (what it
//! sent is read before it is judged: its line may have come after it was accepted), else one
//! whose `REQUEST` has not gone out and that sent nothing behind its line; and a client that
//! sent its first bytes with its line (the agent client sends its `Hello` so) may also push
//! out the connection the guest accepted longest ago and has sent nothing on since (the agent
//! answers nothing before a valid `Hello`, so these are the connections it has not
//! authenticated, silent or slow), or, when none is left, the silent client whose `REQUEST`
//! the guest has left unanswered longest (a loaded guest answers a flood's late). Host clients that flood the socket, with or without their
//! `CONNECT` line, however fast they come back, then push out each other or are refused on
//! the host, costing the guest nothing, while a real client gets in; a connection the guest
//! has answered on, or whose client sent its first bytes with its line, is never evicted.
//! Each listener event accepts at most [`ACCEPT_BATCH`] clients, and what a client already
//! sent is read as it is accepted, so a real client's line (and its first bytes) are seen
//! before a flood can push it out. A client connects before it can write, so the device may
//! accept it in between (on a loaded host, 8 times in a row under issue 39's flood): one
//! accepted over the cap before it sent anything is held one past the cap and judged when it
//! speaks, when another such client takes its place, or at its deadline.

use super::*;

impl Muxer {
    pub(super) fn accept_all(&mut self, ctx: &dyn VsockQueues) {
        for _ in 0..ACCEPT_BATCH {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
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
            // What the client already sent is read now, not at its next event: whether it
            // speaks at once decides what it may push out at the cap (one past the cap for
            // this moment: the descriptor budget keeps room for it).
            let newcomer = self.handshake(token, ctx);
            if self.count() > self.max_conns && newcomer == Some(token) && !self.heard(token) {
                // It has sent nothing yet: a client connects, then writes, and the device may
                // accept it in between. Held one past the cap, it is judged when it speaks.
                if let Some(before) = self.deferred.replace(token) {
                    self.judge(before, ctx);
                }
            }
            if self.over_cap() {
                self.make_room(newcomer, ctx);
            }
        }
    }

    /// An event on pending client `token`: reads what it sent; the deferred client is judged
    /// once its line is complete (or it is dropped).
    pub(super) fn pending_event(&mut self, token: u64, ctx: &dyn VsockQueues) {
        let now = self.handshake(token, ctx);
        if self.deferred == Some(token) && now != Some(token) {
            self.deferred = None;
            if self.over_cap() {
                self.make_room(now, ctx);
            }
        }
    }

    /// Judges a client that was deferred, now (another took its place): what it sent since
    /// is read, and it makes room, or is refused, as any newcomer at the cap.
    fn judge(&mut self, token: u64, ctx: &dyn VsockQueues) {
        if !matches!(self.slots.get(&token), Some(Slot::Pending(_))) {
            return;
        }
        let now = self.handshake(token, ctx);
        if self.over_cap() {
            self.make_room(now, ctx);
        }
    }

    /// Whether pending client `token` has sent any byte yet (a connection has).
    fn heard(&self, token: u64) -> bool {
        match self.slots.get(&token) {
            Some(Slot::Pending(p)) => p.heard(),
            _ => true,
        }
    }

    /// One connection over the cap, the newest being `newcomer` (pending, or connecting if
    /// its line was complete): drops the oldest silent client (see the module docs), or the
    /// newcomer when nothing it may push out is left. Only a newcomer that sent its first
    /// bytes with its line pushes out a connection the guest accepted: a flood of silent
    /// clients then costs the guest nothing past the cap, its connections are refused on
    /// the host.
    fn make_room(&mut self, newcomer: Option<u64>, ctx: &dyn VsockQueues) {
        let mut newcomer = newcomer.unwrap_or(0);
        if self.evict_oldest_pending(&mut newcomer, ctx) || self.evict_oldest_unsent() {
            return;
        }
        let eager = match self.slots.get(&newcomer) {
            Some(Slot::Conn(key)) => self.conns.get(key).is_some_and(|c| c.eager),
            _ => false,
        };
        if eager && (self.evict_oldest_silent() || self.evict_oldest_waiting()) {
            return;
        }
        tracing::debug!("vsock: connection limit reached; refusing host client");
        match self.slots.get(&newcomer) {
            Some(Slot::Pending(_)) => {
                self.slots.remove(&newcomer);
                self.pending -= 1;
            }
            Some(Slot::Conn(key)) => {
                let key = *key;
                self.remove(key, false);
            }
            None => {}
        }
    }

    /// Drops the oldest host client still sending its `CONNECT` line; false if there is none.
    /// What each candidate sent is read first: a client whose line (and first bytes) reached
    /// its socket after it was accepted, before its event came round, is no silent client but
    /// a connection, judged as one (`newcomer` follows it if it is the newcomer). A client
    /// dropped for what it sent frees a slot too.
    fn evict_oldest_pending(&mut self, newcomer: &mut u64, ctx: &dyn VsockQueues) -> bool {
        loop {
            let keep = self.deferred_live();
            let slots = &self.slots;
            let oldest = self
                .timers
                .pop_oldest_pending(|t| matches!(slots.get(&t), Some(Slot::Pending(_))), keep);
            let Some(token) = oldest else {
                return false;
            };
            match self.handshake(token, ctx) {
                Some(t) if t == token => {
                    tracing::debug!(
                        "vsock: connection limit reached; evicting the oldest silent client"
                    );
                    self.slots.remove(&token);
                    self.pending -= 1;
                    return true;
                }
                Some(t) => {
                    if token == *newcomer {
                        *newcomer = t;
                    }
                }
                None => return true,
            }
        }
    }

    /// Drops the oldest connection whose `REQUEST` has not gone out and whose client sent
    /// nothing behind its `CONNECT` line (the guest has not heard of it: nothing to tell it);
    /// false if there is none.
    fn evict_oldest_unsent(&mut self) -> bool {
        let Some(key) = self.rx_new.pop_front() else {
            return false;
        };
        tracing::debug!("vsock: connection limit reached; evicting the oldest silent client");
        self.remove(key, false);
        true
    }

    /// Drops the connection the guest accepted longest ago and has sent nothing on since,
    /// telling the guest (`RST`); false if there is none.
    fn evict_oldest_silent(&mut self) -> bool {
        let Some((_, key)) = self.silent.pop_first() else {
            return false;
        };
        tracing::debug!("vsock: connection limit reached; evicting the oldest silent connection");
        self.remove(key, true);
        true
    }

    /// Drops the connection whose `REQUEST` went out longest ago, unanswered, and whose client
    /// sent nothing with its line, telling the guest (`RST`); false if there is none. Under a
    /// loaded guest a flood's `REQUEST`s can wait long enough to hold every slot the silent
    /// ones would have left.
    fn evict_oldest_waiting(&mut self) -> bool {
        let Some((_, key)) = self.waiting.pop_first() else {
            return false;
        };
        tracing::debug!("vsock: connection limit reached; evicting the oldest unanswered client");
        self.remove(key, true);
        true
    }

    /// Reads what the pending client `token` sent; a complete `CONNECT` line makes it a
    /// connection. Returns its slot's token afterwards (the same while its line is
    /// incomplete, a new one once it is a connection), `None` once it is gone.
    pub(super) fn handshake(&mut self, token: u64, ctx: &dyn VsockQueues) -> Option<u64> {
        let Some(Slot::Pending(p)) = self.slots.get_mut(&token) else {
            return None;
        };
        let port = match p.advance() {
            Handshake::Incomplete => return Some(token),
            Handshake::Drop => None,
            Handshake::Connect(port) => Some(port),
        };
        let Some(Slot::Pending(p)) = self.slots.remove(&token) else {
            return None;
        };
        self.pending -= 1;
        let guest_port = port?;
        let fd = p.stream.as_raw_fd();
        ctx.epoll_ctl(ControlOperation::Delete, fd, EventSet::IN, token);
        let host_port = self.alloc_host_port(guest_port)?;
        let mut conn = Conn::new(p.stream, 0, State::Connecting);
        conn.send_request = true;
        conn.eager = crate::sys::has_unread(&conn.stream);
        let key = (host_port, guest_port);
        let token = self.insert_conn(key, conn, ctx);
        self.add_timer(
            Instant::now() + RESPONSE_TIMEOUT,
            Timer::Connecting(key, token),
        );
        Some(token)
    }

    pub(super) fn alloc_host_port(&mut self, guest_port: u32) -> Option<u32> {
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

    pub(super) fn conn_event(&mut self, key: ConnKey, events: EventSet, ctx: &dyn VsockQueues) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        if c.guest_closed {
            // Only delivering what the guest sent before it closed: done, or the host is gone.
            if c.flush_tx().is_err() || c.tx_drained() {
                self.remove(key, true);
            } else {
                self.sync_interest(key, ctx);
            }
            return;
        }
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
}
