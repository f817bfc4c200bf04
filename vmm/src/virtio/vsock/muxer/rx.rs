//! Host to guest: filling the RX queue (bare RSTs first, then ready connections in
//! round-robin, connections with traffic and new ones' `REQUEST`s in turn, within the
//! guest's credit) and the event queue's transport reset.

use super::*;

impl Muxer {
    /// Fill RX buffers: bare RSTs first, then connections in round-robin (not until the
    /// guest handled a transport reset: see [`Muxer::transport_reset`]).
    pub(super) fn fill_rx(&mut self, ctx: &mut dyn VsockQueues) -> Result<(), QueueError> {
        let mut used = false;
        loop {
            let conns_ready = self.conns_queued() && !self.reset_unacked;
            if self.rsts.is_empty() && !conns_ready {
                break;
            }
            let Some(chain) = ctx.pop(RXQ)? else {
                break;
            };
            let bufs = match chain.bufs {
                Ok(b) if queue::writable_len(&b) >= HDR_SIZE as u64 => b,
                _ => {
                    ctx.add_used(RXQ, chain.head, 0)?;
                    used = true;
                    continue;
                }
            };
            let written = match self.rsts.pop_front() {
                Some(h) => queue::write_chain(ctx.mem(), &bufs, 0, &h.to_bytes()),
                None => self.conn_packet(&bufs, ctx),
            };
            if written == 0 {
                ctx.undo_pop(RXQ);
                continue;
            }
            ctx.add_used(RXQ, chain.head, written as u32)?;
            used = true;
        }
        if used && ctx.needs_notification(RXQ) {
            ctx.signal_used(RXQ);
        }
        Ok(())
    }

    /// Write the next packet of the next ready connection into `bufs`; 0 if none was written
    /// (the chain is then put back).
    pub(super) fn conn_packet(&mut self, bufs: &[Buf], ctx: &dyn VsockQueues) -> usize {
        let Some(key) = self.next_ready() else {
            return 0;
        };
        let cid = self.guest_cid;
        let Some(c) = self.conns.get_mut(&key) else {
            return 0;
        };
        if c.guest_closed {
            // Nothing more goes to a guest socket that is closed.
            c.queued = false;
            return 0;
        }
        let mut written = 0;
        let ctrl = if c.send_request {
            c.send_request = false;
            if !c.eager {
                self.waiting.insert(c.token, key);
            }
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
                written = queue::write_chain(ctx.mem(), bufs, 0, &h.to_bytes());
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
                    let w = queue::write_chain(ctx.mem(), bufs, 0, &h.to_bytes());
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
                        let hw = queue::write_chain(ctx.mem(), bufs, 0, &h.to_bytes());
                        let dw = queue::write_chain(
                            ctx.mem(),
                            bufs,
                            HDR_SIZE as u64,
                            &self.scratch[..m],
                        );
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

    pub(super) fn deliver_reset_event(
        &mut self,
        ctx: &mut dyn VsockQueues,
    ) -> Result<(), QueueError> {
        if !self.reset_event_pending {
            return Ok(());
        }
        let Some(chain) = ctx.pop(EVQ)? else {
            return Ok(());
        };
        let n = match &chain.bufs {
            Ok(b) => queue::write_chain(ctx.mem(), b, 0, &EVENT_TRANSPORT_RESET.to_le_bytes()),
            Err(_) => 0,
        };
        if n == 4 {
            self.reset_event_pending = false;
        }
        ctx.add_used(EVQ, chain.head, n as u32)?;
        ctx.signal_used(EVQ);
        Ok(())
    }
}
