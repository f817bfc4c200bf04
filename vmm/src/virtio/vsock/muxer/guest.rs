//! Guest to host: the TX queue. Every chain is parsed and validated ([`packet::parse_tx`]);
//! a packet moves one connection's state machine, and a guest `REQUEST` is refused with `RST`.

use super::*;

impl Muxer {
    pub(super) fn process_tx(&mut self, ctx: &mut dyn VsockQueues) -> Result<(), QueueError> {
        let mut used = false;
        while let Some(chain) = ctx.pop(TXQ)? {
            if let Ok(bufs) = &chain.bufs {
                self.tx_chain(bufs, ctx);
            }
            ctx.add_used(TXQ, chain.head, 0)?;
            used = true;
        }
        if used && ctx.needs_notification(TXQ) {
            ctx.signal_used(TXQ);
        }
        Ok(())
    }

    pub(super) fn tx_chain(&mut self, bufs: &[Buf], ctx: &dyn VsockQueues) {
        let mut hb = [0u8; HDR_SIZE];
        let got = queue::read_chain(ctx.mem(), bufs, 0, &mut hb);
        let payload_room = queue::readable_len(bufs).saturating_sub(HDR_SIZE as u64);
        match packet::parse_tx(&hb[..got], self.guest_cid, payload_room) {
            Ok(hdr) => {
                let len = if hdr.op == op::RW {
                    hdr.len as usize
                } else {
                    0
                };
                let mut scratch = std::mem::take(&mut self.scratch);
                let n = queue::read_chain(ctx.mem(), bufs, HDR_SIZE as u64, &mut scratch[..len]);
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

    /// Handle one validated packet from the guest; `payload` holds RW data.
    pub(super) fn guest_packet(&mut self, hdr: &Header, payload: &[u8], ctx: &dyn VsockQueues) {
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
                self.waiting.remove(&c.token);
                let ok = format!("OK {}\n", key.0);
                if c.stream.write_all(ok.as_bytes()).is_err() {
                    self.remove(key, true);
                    return;
                }
                c.state = State::Established;
                if c.send_request {
                    // An answer to a REQUEST never sent (a guest guessing ports): nothing
                    // more to send it; out of the new connections' queues.
                    c.send_request = false;
                    if c.queued {
                        c.queued = false;
                        self.rx_eager.retain(|k| *k != key);
                        self.rx_new.retain(|k| *k != key);
                    }
                }
                self.silent.insert(c.token, key);
            }
            // The guest gave up waiting for our RST after its close (Linux: 8 s); what it
            // sent before closing is still delivered, within CLOSE_LINGER.
            op::RST if c.guest_closed => return,
            op::RST => {
                self.remove(key, false);
                return;
            }
            op::SHUTDOWN if c.guest_closed => return,
            op::SHUTDOWN => {
                c.guest_shut_send |= hdr.flags & packet::SHUTDOWN_SEND != 0;
                let both = packet::SHUTDOWN_RCV | packet::SHUTDOWN_SEND;
                if c.flush_tx().is_err() {
                    self.remove(key, true);
                    return;
                }
                if hdr.flags & both == both {
                    if c.tx_drained() {
                        self.remove(key, true);
                    } else {
                        self.linger(key, ctx);
                    }
                    return;
                }
            }
            op::RW if c.state == State::Established => {
                if !payload.is_empty() {
                    self.silent.remove(&c.token);
                }
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

    /// The guest closed `key` while data it sent still waits for the host socket: keep the
    /// connection only to deliver that (see `connection`), for at most [`CLOSE_LINGER`].
    fn linger(&mut self, key: ConnKey, ctx: &dyn VsockQueues) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        c.guest_closed = true;
        let token = c.token;
        self.sync_interest(key, ctx);
        self.add_timer(Instant::now() + CLOSE_LINGER, Timer::Closing(key, token));
    }

    /// A guest `REQUEST`: refused with RST (a request reusing a live key also resets that
    /// connection). Counted; logged through the rate limiter, as the guest controls the rate.
    pub(super) fn guest_connect(&mut self, key: ConnKey) {
        if self.conns.contains_key(&key) {
            self.remove(key, true);
            return;
        }
        let n = GUEST_CONNECTS_REFUSED.fetch_add(1, Ordering::Relaxed);
        crate::log_limited!(
            INFO,
            None,
            host_port = key.0,
            refused = n + 1,
            "vsock: guest-initiated connection refused"
        );
        self.queue_rst(key);
    }
}
