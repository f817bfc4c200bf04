//! Saving and restoring an [`MmioDevice`] (its state types and checks: `virtio::persist`).
//!
//! Quiescence, the simplest correct choice: with the vCPUs parked (nothing writes the
//! registers or notifies), [`MmioDevice::save_state`] stops the device's worker thread and
//! joins it, and the thread hands its queues back. A worker serves each notification to the
//! end before it reads the next event (block and rng answer every chain they pop; vsock puts
//! back what it cannot fill), so the returned `next_avail`/`next_used` are final and every
//! used entry is in guest RAM before the memory file is written. A worker still pending
//! (DRIVER_OK written, the control thread not there yet) is dropped and its queues taken.
//!
//! Afterwards the worker is started again through the starter, the path DRIVER_OK takes
//! (`request_worker`: a new handler over the saved queues, every queue kicked once so chains
//! posted meanwhile are seen): by [`MmioDevice::resume_after_save`] when the VM runs on, by
//! [`MmioDevice::restore_state`] in a restored VM (its control thread starts it at
//! `start()`). Backends keep nothing across this: block reopens nothing (its handler gets a
//! new handle on the same file), and vsock's connections are dropped with the old handler, so
//! a vsock device started again queues `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` (one pending
//! event at most, sent when the guest has an event buffer), as Firecracker does on both a
//! snapshot and a restore.
//!
//! Refused, by name: a writable disk (its file keeps changing after the snapshot, and every
//! restore would write to the same file).

use virtio_queue::{Queue, QueueT};
use vm_sync::Lock;

use super::MmioDevice;
use crate::virtio::VirtioError;
use crate::virtio::persist::{DeviceKind, DeviceState, InvalidDevice, QueueState, TransportState};
use crate::virtio::queue::queue_usable;
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_DRIVER_OK;

/// Why a device cannot be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Something a snapshot cannot carry.
    #[error("{device}: {what} cannot be snapshotted")]
    Unsupported {
        /// The device's name.
        device: String,
        /// What.
        what: &'static str,
    },
    /// The worker panicked, so its queue positions are lost.
    #[error("{0}: its worker thread was lost")]
    WorkerLost(String),
    /// The device to restore into is not the one saved.
    #[error("{device}: snapshot has {field} {snapshot}, the device {config}")]
    Mismatch {
        /// The device's name.
        device: String,
        /// What differs: `type`, `path`, `read_only`, `size`, `guest_cid`.
        field: &'static str,
        /// The snapshot's value.
        snapshot: String,
        /// The device's value.
        config: String,
    },
    /// The saved state is not valid for this device.
    #[error("invalid device state")]
    Invalid(#[source] InvalidDevice),
    /// A saved queue that `virtio-queue` refuses.
    #[error("{device}: queue {queue}")]
    Queue {
        /// The device's name.
        device: String,
        /// Queue index.
        queue: usize,
        /// Cause.
        #[source]
        source: virtio_queue::Error,
    },
    /// DRIVER_OK is saved but a queue is not usable in this guest memory.
    #[error("{device}: queue {queue} is not usable after DRIVER_OK")]
    QueueUnusable {
        /// The device's name.
        device: String,
        /// Queue index.
        queue: usize,
    },
    /// Building the device or starting its worker failed.
    #[error("{device}")]
    Device {
        /// The device's name.
        device: String,
        /// Cause.
        #[source]
        source: VirtioError,
    },
}

impl MmioDevice {
    /// The device's state for a snapshot, its worker stopped (see the module docs). Call with
    /// the vCPUs parked; then [`MmioDevice::resume_after_save`] if the VM runs on.
    pub fn save_state(&mut self) -> Result<DeviceState, PersistError> {
        let kind = self.kind.clone();
        if matches!(&kind, DeviceKind::Block(b) if !b.read_only) {
            return Err(PersistError::Unsupported {
                device: self.name.clone(),
                what: "a writable disk",
            });
        }
        let (was_active, queues) = {
            let mut slot = self.slot.locked();
            (slot.active(), slot.quiesce())
        };
        match queues {
            Some(q) => self.queues = q,
            None if was_active => return Err(PersistError::WorkerLost(self.name.clone())),
            None => {}
        }
        let queues = self
            .queues
            .iter()
            .map(|q| QueueState {
                size: q.size(),
                ready: q.ready(),
                desc: q.desc_table(),
                avail: q.avail_ring(),
                used: q.used_ring(),
                next_avail: q.next_avail(),
                next_used: q.next_used(),
                event_idx: q.event_idx_enabled(),
            })
            .collect();
        Ok(DeviceState {
            kind,
            transport: TransportState {
                status: self.status,
                needs_reset: self.irq.needs_reset(),
                acked_features: self.acked_features,
                device_features_sel: self.device_features_sel,
                driver_features_sel: self.driver_features_sel,
                queue_sel: self.queue_sel,
                config_generation: self.config_generation,
                interrupt_status: self.irq.status(),
            },
            queues,
            fs: self.device.save_session(),
        })
    }

    /// Whether a worker must serve the device: DRIVER_OK, and not in DEVICE_NEEDS_RESET.
    fn should_run(&self) -> bool {
        self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0 && !self.irq.needs_reset()
    }

    /// Start the worker [`MmioDevice::save_state`] stopped (with the queues it handed back),
    /// through the starter; a vsock device tells the guest its connections are gone.
    pub fn resume_after_save(&mut self) -> Result<(), PersistError> {
        if !self.should_run() || self.is_active() {
            return Ok(());
        }
        self.restart_worker()
    }

    fn restart_worker(&mut self) -> Result<(), PersistError> {
        if let Err(source) = self.request_worker() {
            self.irq.set_needs_reset();
            return Err(PersistError::Device {
                device: self.name.clone(),
                source,
            });
        }
        if self.device.resets_on_restart() {
            // After `prepare_worker` drained the request event: the new worker sees this.
            let _ = self.request.write(1);
        }
        Ok(())
    }

    /// Set a freshly built device (same config as the saved one) to `s`: registers, queues,
    /// interrupt status; after DRIVER_OK its worker is requested from the starter (it starts
    /// when the control thread runs), and a saved interrupt is signalled again.
    pub fn restore_state(&mut self, s: &DeviceState) -> Result<(), PersistError> {
        let now = &self.kind;
        if let Some(d) = s.kind.difference(now) {
            return Err(PersistError::Mismatch {
                device: self.name.clone(),
                field: d.field,
                snapshot: d.saved,
                config: d.now,
            });
        }
        // The decoder checked this already, against the same kind; again, for a state that
        // did not come from a file.
        s.validate(0, &self.ram_regions())
            .map_err(PersistError::Invalid)?;
        if let Some(session) = &s.fs {
            self.device.restore_session(session);
        }
        let queues = s
            .queues
            .iter()
            .zip(&self.queues)
            .enumerate()
            .map(|(queue, (q, old))| {
                Queue::try_from(virtio_queue::QueueState {
                    max_size: old.max_size(),
                    next_avail: q.next_avail,
                    next_used: q.next_used,
                    event_idx_enabled: q.event_idx,
                    size: q.size,
                    ready: q.ready,
                    desc_table: q.desc,
                    avail_ring: q.avail,
                    used_ring: q.used,
                })
                .map_err(|source| PersistError::Queue {
                    device: self.name.clone(),
                    queue,
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.requested_sizes = queues.iter().map(|q| q.size()).collect();
        self.queues = queues;
        let t = &s.transport;
        self.status = t.status;
        self.acked_features = t.acked_features;
        self.device_features_sel = t.device_features_sel;
        self.driver_features_sel = t.driver_features_sel;
        self.queue_sel = t.queue_sel;
        self.config_generation = t.config_generation;
        self.irq.restore(t.interrupt_status, t.needs_reset);
        if self.should_run() {
            let unusable = self
                .queues
                .iter()
                .zip(&self.requested_sizes)
                .position(|(q, &size)| !queue_usable(q, size, &self.mem));
            if let Some(queue) = unusable {
                return Err(PersistError::QueueUnusable {
                    device: self.name.clone(),
                    queue,
                });
            }
            self.restart_worker()?;
        }
        if t.interrupt_status != 0 {
            self.irq.raise(t.interrupt_status);
        }
        Ok(())
    }

    /// Guest RAM as regions, for [`DeviceState::validate`].
    fn ram_regions(&self) -> Vec<crate::snapshot::state::RegionState> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        self.mem
            .iter()
            .map(|r| crate::snapshot::state::RegionState {
                guest_addr: r.start_addr().0,
                size: r.len(),
            })
            .collect()
    }
}
