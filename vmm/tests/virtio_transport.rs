//! virtio-mmio transport: register window, handshake enforcement, reset, and malformed rings
//! (driven through the rng device, whose requests are simplest).

use std::time::Duration;

use vmm::virtio::mmio::{reg, status};
use vmm::virtio::test_utils::{Driver, F_NEXT, MEM_SIZE, Seg};
use vmm::virtio::{DeviceConfig, VIRTIO_F_VERSION_1};

const V1: u64 = 1 << VIRTIO_F_VERSION_1;
const T: Duration = Duration::from_secs(5);

fn rng() -> Driver {
    Driver::new(&DeviceConfig::Rng).unwrap()
}

fn request(d: &mut Driver, len: u32) -> (u16, u32) {
    let a = d.alloc(u64::from(len));
    d.add_chain(0, &[Seg::writable(a, len)]);
    d.notify(0);
    d.wait_used(0, T).expect("no used buffer")
}

#[test]
fn identification_registers() {
    let mut d = rng();
    assert_eq!(d.read_reg(reg::MAGIC), 0x7472_6976);
    assert_eq!(d.read_reg(reg::VERSION), 2);
    assert_eq!(d.read_reg(reg::DEVICE_ID), 4);
    assert!(d.device_features() & V1 != 0);
    d.write_reg(reg::QUEUE_SEL, 0);
    assert_eq!(d.read_reg(reg::QUEUE_NUM_MAX), 256);
    d.write_reg(reg::QUEUE_SEL, 1);
    assert_eq!(d.read_reg(reg::QUEUE_NUM_MAX), 0);
}

#[test]
fn unoffered_feature_is_refused() {
    let mut d = rng();
    assert!(!d.negotiate(V1 | (1 << 3)));
    assert_eq!(d.status() & status::FEATURES_OK, 0);
}

#[test]
fn version_1_is_required() {
    let mut d = rng();
    assert!(!d.negotiate(0));
    assert!(d.negotiate(V1));
}

#[test]
fn queue_registers_ignored_before_features_ok() {
    let mut d = rng();
    d.write_reg(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    d.write_reg(reg::QUEUE_SEL, 0);
    d.write_reg(reg::QUEUE_READY, 1);
    assert_eq!(d.read_reg(reg::QUEUE_READY), 0);
}

#[test]
fn queue_registers_ignored_after_driver_ok() {
    let mut d = rng();
    d.activate(0);
    d.write_reg(reg::QUEUE_SEL, 0);
    d.write_reg(reg::QUEUE_READY, 0);
    assert_eq!(d.read_reg(reg::QUEUE_READY), 1);
}

#[test]
fn driver_ok_without_features_ok_is_ignored() {
    let mut d = rng();
    d.write_reg(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    d.write_reg(
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::DRIVER_OK,
    );
    assert_eq!(d.status() & status::DRIVER_OK, 0);
    assert!(!d.dev.is_active());
}

fn activate_with_size(size: u16) -> Driver {
    let mut d = rng();
    assert!(d.negotiate(V1));
    d.setup_queue(0, size);
    d.driver_ok();
    d
}

#[test]
fn queue_size_not_power_of_two_needs_reset() {
    let mut d = activate_with_size(100);
    assert!(d.status() & status::DEVICE_NEEDS_RESET != 0);
    assert!(!d.dev.is_active());
}

#[test]
fn queue_size_zero_needs_reset() {
    let mut d = activate_with_size(0);
    assert!(d.status() & status::DEVICE_NEEDS_RESET != 0);
    assert!(!d.dev.is_active());
}

#[test]
fn queue_larger_than_max_needs_reset() {
    let mut d = activate_with_size(512);
    assert!(d.status() & status::DEVICE_NEEDS_RESET != 0);
}

#[test]
fn ring_outside_ram_needs_reset() {
    let mut d = rng();
    assert!(d.negotiate(V1));
    d.setup_queue(0, 256);
    let far = MEM_SIZE as u64 + 0x1000;
    d.write_reg(reg::QUEUE_USED_LOW, far as u32);
    d.driver_ok();
    assert!(d.status() & status::DEVICE_NEEDS_RESET != 0);
    assert!(!d.dev.is_active());
}

#[test]
fn reset_returns_to_initial_state_and_device_works_again() {
    let mut d = rng();
    d.activate(0);
    let (_, len) = request(&mut d, 64);
    assert_eq!(len, 64);
    d.write_reg(reg::STATUS, 0);
    assert_eq!(d.status(), 0);
    assert!(!d.dev.is_active());
    d.write_reg(reg::QUEUE_SEL, 0);
    assert_eq!(d.read_reg(reg::QUEUE_READY), 0);
    assert_eq!(d.read_reg(reg::INTERRUPT_STATUS), 0);
    // A fresh bring-up starts at ring index 0 again and is served.
    d.activate(0);
    let (_, len) = request(&mut d, 32);
    assert_eq!(len, 32);
}

#[test]
fn avail_index_running_ahead_needs_reset() {
    let mut d = rng();
    d.activate(0);
    d.set_avail_idx(0, 300);
    d.notify(0);
    assert!(d.wait_irq(T), "no config interrupt");
    assert!(d.status() & status::DEVICE_NEEDS_RESET != 0);
}

#[test]
fn descriptor_loop_fails_request_and_device_keeps_serving() {
    let mut d = rng();
    d.activate(0);
    let a = d.alloc(64);
    let seg = Seg::writable(a, 16);
    d.write_desc(0, 10, seg, F_NEXT, 11);
    d.write_desc(0, 11, seg, F_NEXT, 10);
    d.push_avail(0, 10);
    d.notify(0);
    let (head, len) = d.wait_used(0, T).unwrap();
    assert_eq!((head, len), (10, 0));
    assert_eq!(d.status() & status::DEVICE_NEEDS_RESET, 0);
    let (_, len) = request(&mut d, 8);
    assert_eq!(len, 8);
}

#[test]
fn buffer_outside_ram_fails_request() {
    let mut d = rng();
    d.activate(0);
    let far = MEM_SIZE as u64 - 8;
    d.add_chain(0, &[Seg::writable(far, 64)]);
    d.notify(0);
    let (_, len) = d.wait_used(0, T).unwrap();
    assert_eq!(len, 0);
}

#[test]
fn chain_length_overflow_fails_request() {
    let mut d = rng();
    d.activate(0);
    let a = d.alloc(16);
    let big = Seg::writable(a, u32::MAX);
    d.add_chain(0, &[big, big]);
    d.notify(0);
    let (_, len) = d.wait_used(0, T).unwrap();
    assert_eq!(len, 0);
}

#[test]
fn head_index_out_of_range_needs_reset() {
    let mut d = rng();
    d.activate(0);
    d.push_avail(0, 999);
    d.notify(0);
    assert!(d.wait_irq(T));
    assert!(d.status() & status::DEVICE_NEEDS_RESET != 0);
}

#[test]
fn notify_events_and_shutdown() {
    let mut d = rng();
    let evs = d.dev.queue_notify_events();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].0, 0);
    d.activate(0);
    let a = d.alloc(16);
    d.add_chain(0, &[Seg::writable(a, 16)]);
    // Notify through the ioeventfd path instead of the register.
    evs[0].1.write(1).unwrap();
    assert_eq!(d.wait_used(0, T).unwrap().1, 16);
    d.dev.shutdown();
    assert!(!d.dev.is_active());
    d.dev.shutdown();
}
