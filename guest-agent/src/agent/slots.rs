//! Connection slots, by what a connection is for: data traffic cannot starve control.
//!
//! Every authenticated connection takes one of `max_conns` slots before its `HelloOk` (a
//! connection past them gets `Busy`, as always). Once its request is read, the request's
//! [`Class`] decides what else it must hold:
//! - [`Class::Control`] (ping, serve start/status/stop, make-dirs, list, listening ports,
//!   shutdown): nothing
//!   more. It is answered at once, so its slot is soon free again.
//! - [`Class::Exec`] (the execs): one of `max_conns - control_reserve` "long" slots,
//!   so however many commands run, `control_reserve` slots stay for control requests (a
//!   serve monitor's status poll, a stop, a shutdown).
//! - [`Class::Data`] (forwards, file reads and writes): a long slot and one of
//!   `max_data_conns` data slots, so idle forwarded TCP connections and file streams can
//!   hold at most that many, and execs and control requests always find room beside them.
//!
//! A request whose class has no room left gets `Busy` (after `HelloOk`, as the reply to its
//! request: older clients already read an `Error` there). Nothing on the wire changes.
//!
//! Sized for real servers: [`SlotLimits::default`] takes 640 forwards and file streams (a
//! host publishes at most 512 connections a port, `vm_sandbox::serving::MAX_CONNECTIONS`),
//! 792 commands and streams together, 800 connections in all: under the vsock device's cap
//! of 1023 a VM (`vmm::virtio::vsock::muxer::MAX_CONNECTIONS`). Every other connection the
//! device holds is one the agent has not answered (not yet authenticated), which the device
//! pushes out for a newcomer at its cap, so a control request always finds both a device
//! connection and an agent slot, however many forwards are open.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a request holds its connection for (see the module docs): declared with each request,
/// in the protocol ([`Request::class`](vm_agent_protocol::protocol::Request::class)).
pub use vm_agent_protocol::protocol::RequestClass as Class;

/// How many slots of each kind (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    /// Authenticated connections at once.
    pub max_conns: usize,
    /// Slots only control requests may take.
    pub control_reserve: usize,
    /// Forwards and file streams at once.
    pub max_data_conns: usize,
}

impl Default for SlotLimits {
    fn default() -> Self {
        SlotLimits {
            max_conns: 800,
            control_reserve: 8,
            max_data_conns: 640,
        }
    }
}

/// The three pools.
#[derive(Debug)]
pub struct Slots {
    all: Arc<Semaphore>,
    long: Arc<Semaphore>,
    data: Arc<Semaphore>,
}

/// What one connection holds; dropping it frees every slot.
#[derive(Debug)]
pub struct Held {
    _all: OwnedSemaphorePermit,
    _long: Option<OwnedSemaphorePermit>,
    _data: Option<OwnedSemaphorePermit>,
}

/// The connection's slot, before its request is known.
#[derive(Debug)]
pub struct Admitted(OwnedSemaphorePermit);

impl Slots {
    pub fn new(l: SlotLimits) -> Slots {
        let long = l.max_conns.saturating_sub(l.control_reserve);
        Slots {
            all: Arc::new(Semaphore::new(l.max_conns)),
            long: Arc::new(Semaphore::new(long)),
            data: Arc::new(Semaphore::new(l.max_data_conns.min(long))),
        }
    }

    /// One of `max_conns` for an authenticated connection; `None` = answer `Busy`.
    pub fn admit(&self) -> Option<Admitted> {
        self.all.clone().try_acquire_owned().ok().map(Admitted)
    }

    /// What a request of `class` holds besides its connection slot; `Err` gives the
    /// connection back (its slot freed on drop) and names the pool that was full.
    pub fn take(&self, a: Admitted, class: Class) -> Result<Held, &'static str> {
        let mut held = Held {
            _all: a.0,
            _long: None,
            _data: None,
        };
        if class == Class::Control {
            return Ok(held);
        }
        held._long = Some(self.long.clone().try_acquire_owned().map_err(
            |_| "too many commands and streams (the rest is kept for control requests)",
        )?);
        if class == Class::Data {
            held._data = Some(
                self.data
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| "too many forwards and file streams")?,
            );
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots() -> Slots {
        Slots::new(SlotLimits {
            max_conns: 6,
            control_reserve: 2,
            max_data_conns: 2,
        })
    }

    #[test]
    fn data_cannot_take_the_exec_or_control_slots() {
        let s = slots();
        let d: Vec<Held> = (0..2)
            .map(|_| s.take(s.admit().unwrap(), Class::Data).unwrap())
            .collect();
        let e = s.take(s.admit().unwrap(), Class::Data).unwrap_err();
        assert!(e.contains("forwards"), "{e}");
        let x: Vec<Held> = (0..2)
            .map(|_| s.take(s.admit().unwrap(), Class::Exec).unwrap())
            .collect();
        // Four long slots taken: a fifth exec is refused, control still gets in, twice.
        assert!(s.take(s.admit().unwrap(), Class::Exec).is_err());
        let c1 = s.take(s.admit().unwrap(), Class::Control).unwrap();
        let c2 = s.take(s.admit().unwrap(), Class::Control).unwrap();
        assert!(s.admit().is_none(), "every connection slot is taken");
        drop((c1, c2));
        drop(d);
        assert!(s.take(s.admit().unwrap(), Class::Data).is_ok());
        drop(x);
    }

    #[test]
    fn every_request_has_a_class() {
        use vm_agent_protocol::protocol::{ExecRequest, Request, ServeId};
        assert_eq!(Request::ServeStatus(ServeId(1)).class(), Class::Control);
        assert_eq!(Request::Exec(ExecRequest::default()).class(), Class::Exec);
        assert_eq!(Request::Forward { port: 80 }.class(), Class::Data);
        let read = Request::ReadFile {
            root: "/".into(),
            path: "f".into(),
            max: 1,
        };
        assert_eq!(read.class(), Class::Data);
    }

    /// The wire does not change: a full class is the `Busy` error frame every client already
    /// reads, now also as the reply to a request. Its bytes, pinned.
    #[test]
    fn busy_reply_bytes_are_unchanged() {
        use vm_agent_protocol::frame::encode_frame;
        use vm_agent_protocol::protocol::{AgentFrame, ErrorKind, MAX_FRAME, WireError};
        let f = AgentFrame::Error(WireError {
            kind: ErrorKind::Busy,
            message: "x".into(),
        });
        // length 4 (u32 LE), variant Error = 1, kind Busy = 5, a 1-byte string "x".
        let golden = [4, 0, 0, 0, 1, 5, 1, b'x'];
        assert_eq!(encode_frame(&f, MAX_FRAME).unwrap(), golden);
    }
}
