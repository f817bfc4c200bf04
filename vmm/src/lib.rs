//! `vmm`: a small KVM virtual machine monitor.
//!
//! Layout: [`bus`] dispatches port I/O and MMIO; `virtio` holds the virtio-mmio transport and
//! devices (block, vsock, rng), with their queue logic testable without KVM.

pub mod bus;
