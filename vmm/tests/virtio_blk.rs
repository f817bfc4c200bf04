//! virtio-blk: reads, GET_ID, capacity, range checks, and read-only enforcement (the host file
//! stays byte-identical).

use std::path::Path;
use std::time::Duration;

use vmm::virtio::DeviceConfig;
use vmm::virtio::block::VIRTIO_BLK_F_RO;
use vmm::virtio::block::request::{req_type, status};
use vmm::virtio::test_utils::{Driver, Seg};

const T: Duration = Duration::from_secs(5);
const SECTORS: u64 = 128;

fn image(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let data: Vec<u8> = (0..SECTORS * 512).map(|i| (i * 7 % 251) as u8).collect();
    let p = dir.join("disk.img");
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

fn disk(path: &Path, read_only: bool) -> Driver {
    let mut d = Driver::new(&DeviceConfig::Block {
        path: path.into(),
        read_only,
        id: "disk-serial-1".into(),
    })
    .unwrap();
    d.activate(0);
    d
}

/// Send one request; returns (status byte, used length, data address).
fn req(d: &mut Driver, kind: u32, sector: u64, data: Option<(u32, bool)>) -> (u8, u32, u64) {
    let h = d.alloc(16);
    let mut hdr = [0u8; 16];
    hdr[..4].copy_from_slice(&kind.to_le_bytes());
    hdr[8..].copy_from_slice(&sector.to_le_bytes());
    d.write_mem(h, &hdr);
    let st = d.alloc(1);
    d.write_mem(st, &[0xff]);
    let mut segs = vec![Seg::readable(h, 16)];
    let mut addr = 0;
    if let Some((len, write)) = data {
        addr = d.alloc(u64::from(len));
        if !write {
            d.write_mem(addr, &vec![0xAA; len as usize]);
        }
        segs.push(Seg { addr, len, write });
    }
    segs.push(Seg::writable(st, 1));
    d.add_chain(0, &segs);
    d.notify(0);
    let (_, used) = d.wait_used(0, T).expect("no completion");
    (d.read_mem(st, 1)[0], used, addr)
}

#[test]
fn capacity_and_features_in_config() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = image(dir.path());
    let mut d = Driver::new(&DeviceConfig::Block {
        path: p,
        read_only: true,
        id: "x".into(),
    })
    .unwrap();
    let cap = u64::from_le_bytes(d.read_config(0, 8).try_into().unwrap());
    assert_eq!(cap, SECTORS);
    assert!(d.device_features() & (1 << VIRTIO_BLK_F_RO) != 0);
}

#[test]
fn read_returns_file_contents() {
    let dir = tempfile::tempdir().unwrap();
    let (p, data) = image(dir.path());
    let mut d = disk(&p, true);
    let (st, used, addr) = req(&mut d, req_type::IN, 3, Some((4096, true)));
    assert_eq!(st, status::OK);
    assert_eq!(used, 4097);
    assert_eq!(d.read_mem(addr, 4096), data[3 * 512..3 * 512 + 4096]);
}

#[test]
fn get_id_answers_serial() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = image(dir.path());
    let mut d = disk(&p, true);
    let (st, _, addr) = req(&mut d, req_type::GET_ID, 0, Some((20, true)));
    assert_eq!(st, status::OK);
    assert_eq!(&d.read_mem(addr, 20)[..14], b"disk-serial-1\0");
}

#[test]
fn read_beyond_end_is_ioerr() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = image(dir.path());
    let mut d = disk(&p, true);
    assert_eq!(
        req(&mut d, req_type::IN, SECTORS - 1, Some((1024, true))).0,
        status::IOERR
    );
    assert_eq!(
        req(&mut d, req_type::IN, u64::MAX, Some((512, true))).0,
        status::IOERR
    );
    // The device still serves a valid read afterwards.
    assert_eq!(
        req(&mut d, req_type::IN, SECTORS - 1, Some((512, true))).0,
        status::OK
    );
}

#[test]
fn unknown_request_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = image(dir.path());
    let mut d = disk(&p, false);
    assert_eq!(req(&mut d, 77, 0, None).0, status::UNSUPP);
}

#[test]
fn chain_without_status_buffer_is_returned_and_device_continues() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = image(dir.path());
    let mut d = disk(&p, true);
    let h = d.alloc(16);
    d.add_chain(0, &[Seg::readable(h, 16)]);
    d.notify(0);
    assert_eq!(d.wait_used(0, T).unwrap().1, 0);
    assert_eq!(
        req(&mut d, req_type::IN, 0, Some((512, true))).0,
        status::OK
    );
}

fn assert_refused_on_read_only(kind: u32, data: Option<(u32, bool)>) {
    let dir = tempfile::tempdir().unwrap();
    let (p, before) = image(dir.path());
    let mut d = disk(&p, true);
    let (st, _, _) = req(&mut d, kind, 0, data);
    assert_eq!(st, status::IOERR, "request type {kind} not refused");
    drop(d);
    assert!(std::fs::read(&p).unwrap() == before, "host file changed");
}

#[test]
fn read_only_refuses_write() {
    assert_refused_on_read_only(req_type::OUT, Some((512, false)));
}

#[test]
fn read_only_refuses_discard() {
    assert_refused_on_read_only(req_type::DISCARD, Some((16, false)));
}

#[test]
fn read_only_refuses_write_zeroes() {
    assert_refused_on_read_only(req_type::WRITE_ZEROES, Some((16, false)));
}

#[test]
fn read_only_refuses_flush_with_write_data() {
    assert_refused_on_read_only(req_type::FLUSH, Some((512, false)));
}

#[test]
fn read_only_plain_flush_is_ok_noop() {
    let dir = tempfile::tempdir().unwrap();
    let (p, before) = image(dir.path());
    let mut d = disk(&p, true);
    assert_eq!(req(&mut d, req_type::FLUSH, 0, None).0, status::OK);
    drop(d);
    assert!(std::fs::read(&p).unwrap() == before);
}

#[test]
fn read_write_disk_writes_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = image(dir.path());
    let mut d = disk(&p, false);
    assert_eq!(
        req(&mut d, req_type::OUT, 2, Some((1024, false))).0,
        status::OK
    );
    assert_eq!(req(&mut d, req_type::FLUSH, 0, None).0, status::OK);
    let (st, _, addr) = req(&mut d, req_type::IN, 2, Some((1024, true)));
    assert_eq!(st, status::OK);
    assert!(d.read_mem(addr, 1024).iter().all(|&b| b == 0xAA));
    drop(d);
    assert!(
        std::fs::read(&p).unwrap()[1024..2048]
            .iter()
            .all(|&b| b == 0xAA)
    );
}

#[test]
fn several_disks_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let (p, data) = image(dir.path());
    let p2 = dir.path().join("b.img");
    std::fs::write(&p2, vec![0x55u8; 4096]).unwrap();
    let mut a = disk(&p, true);
    let mut b = disk(&p2, true);
    let (_, _, x) = req(&mut a, req_type::IN, 0, Some((512, true)));
    let (_, _, y) = req(&mut b, req_type::IN, 0, Some((512, true)));
    assert_eq!(a.read_mem(x, 512), data[..512]);
    assert!(b.read_mem(y, 512).iter().all(|&v| v == 0x55));
}

#[test]
fn id_longer_than_20_bytes_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _) = image(dir.path());
    let r = Driver::new(&DeviceConfig::Block {
        path: p,
        read_only: true,
        id: "x".repeat(21),
    });
    assert!(r.is_err());
}
