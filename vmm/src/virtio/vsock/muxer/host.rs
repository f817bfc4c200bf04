//! The host side of the muxer: accepting host clients on the Unix socket, their `CONNECT`
//! handshake (bounded by the connection limit and a deadline), host port allocation, and
//! readiness events on established connections' sockets.
//!
//! At the connection cap a new host client takes the slot of the oldest one still silent (no
//! complete `CONNECT` line yet) rather than being refused: silent clients, however many and
//! however fast they come, can delay a real client by at most one accept round, never lock it
//! out. Only connections the guest accepted are never evicted. Each listener event accepts at
//! most [`ACCEPT_BATCH`] clients, so the handshakes of those already accepted are read before
//! a flood can push them out.

use super::*;

impl Muxer {
    pub(super) fn accept_all(&mut self, ctx: &dyn VsockQueues) {
        for _ in 0..ACCEPT_BATCH {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if self.count() >= self.max_conns && !self.evict_oldest_pending() {
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

    /// Drops the oldest host client still sending its `CONNECT` line; false if there is none.
    fn evict_oldest_pending(&mut self) -> bool {
        let slots = &self.slots;
        let oldest = self
            .timers
            .pop_oldest_pending(|t| matches!(slots.get(&t), Some(Slot::Pending(_))));
        let Some(token) = oldest else {
            return false;
        };
        tracing::debug!("vsock: connection limit reached; evicting the oldest silent client");
        self.slots.remove(&token);
        self.pending -= 1;
        true
    }

    pub(super) fn handshake(&mut self, token: u64, ctx: &dyn VsockQueues) {
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
            Instant::now() + RESPONSE_TIMEOUT,
            Timer::Connecting(key, token),
        );
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
