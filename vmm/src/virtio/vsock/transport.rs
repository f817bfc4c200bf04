//! What the muxer needs from the transport that carries its three queues: guest memory, the
//! queues (pop a validated chain, put one back, add to the used ring), the guest interrupt,
//! a way to say "the driver broke a queue", and an epoll set for its host sockets.
//!
//! One muxer, two transports: the in-process virtio-mmio device (`worker::Ctx`, below) and
//! the vhost-user backend of `vm-vsock` (`super::vhost_user`). Both hand the muxer chains
//! that `queue::pop_chain` validated against guest RAM; neither lets it see a queue the
//! driver has not made ready.

use std::os::fd::RawFd;

use vmm_sys_util::epoll::{ControlOperation, EventSet};

use crate::metrics::DeviceMetrics;
use crate::virtio::GuestMemoryMmap;
use crate::virtio::queue::{self, Chain, QueueError};
use crate::virtio::worker::Ctx;

/// The queue, interrupt and epoll operations the vsock muxer drives.
pub trait VsockQueues {
    /// Guest memory.
    fn mem(&self) -> &GuestMemoryMmap;
    /// Pop the next available chain of queue `q` (`None` also when the queue is not usable).
    fn pop(&mut self, q: usize) -> Result<Option<Chain>, QueueError>;
    /// Put the last popped chain of queue `q` back.
    fn undo_pop(&mut self, q: usize);
    /// Return chain `head` of queue `q` with `len` bytes written.
    fn add_used(&mut self, q: usize, head: u16, len: u32) -> Result<(), QueueError>;
    /// Whether the driver wants an interrupt for what was just added to queue `q`.
    fn needs_notification(&mut self, q: usize) -> bool;
    /// Interrupt the driver for queue `q`.
    fn signal_used(&mut self, q: usize);
    /// The driver drove a queue wrongly: stop serving the queues until it resets the device.
    fn set_needs_reset(&self);
    /// Add, modify or remove one of the muxer's descriptors in its epoll set.
    fn epoll_ctl(&self, op: ControlOperation, fd: RawFd, events: EventSet, token: u64);
    /// The device's counters, where the transport keeps them (the in-process device).
    fn metrics(&self) -> Option<&DeviceMetrics> {
        None
    }
}

impl VsockQueues for Ctx<'_> {
    fn mem(&self) -> &GuestMemoryMmap {
        self.mem
    }

    fn pop(&mut self, q: usize) -> Result<Option<Chain>, QueueError> {
        match self.queues.get_mut(q) {
            Some(queue) => queue::pop_chain(queue, self.mem),
            None => Ok(None),
        }
    }

    fn undo_pop(&mut self, q: usize) {
        if let Some(queue) = self.queues.get_mut(q) {
            queue::undo_pop(queue);
        }
    }

    fn add_used(&mut self, q: usize, head: u16, len: u32) -> Result<(), QueueError> {
        match self.queues.get_mut(q) {
            Some(queue) => {
                self.metrics.request(u64::from(len));
                queue::add_used(queue, self.mem, head, len)
            }
            None => Err(QueueError::UsedRing),
        }
    }

    fn needs_notification(&mut self, q: usize) -> bool {
        self.queues
            .get_mut(q)
            .is_none_or(|queue| queue::needs_notification(queue, self.mem))
    }

    fn signal_used(&mut self, _q: usize) {
        self.irq.signal_used();
    }

    fn set_needs_reset(&self) {
        self.metrics.error();
        self.irq.set_needs_reset();
    }

    fn epoll_ctl(&self, op: ControlOperation, fd: RawFd, events: EventSet, token: u64) {
        Ctx::epoll_ctl(self, op, fd, events, token);
    }

    fn metrics(&self) -> Option<&DeviceMetrics> {
        Some(self.metrics)
    }
}
