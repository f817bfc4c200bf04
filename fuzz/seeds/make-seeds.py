#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/seeds/<target>/ (committed; rerun after a format change).

Each seed is a small, meaningful input: the well-formed cases a guest driver really sends and
the edge cases the parsers and the queue walker must refuse, so a fuzz run starts from the
interesting shapes instead of from nothing. ci/test.sh passes these directories to
`cargo fuzz run` after fuzz/corpus/<target> (git-ignored), where libFuzzer keeps what it finds.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# vsock_header: a 44-byte virtio-vsock header (guest CID 3), or a hybrid-vsock CONNECT line.
def vsock(src_cid=3, dst_cid=2, src_port=1024, dst_port=50000, length=0, kind=1, op=5,
          flags=0, buf_alloc=65536, fwd_cnt=0):
    return struct.pack("<QQIIIHHIII", src_cid, dst_cid, src_port, dst_port, length, kind, op,
                       flags, buf_alloc, fwd_cnt)


write("vsock_header", "rw-small", vsock(length=5) + b"hello")
write("vsock_header", "rw-max-payload", vsock(length=64 * 1024))
write("vsock_header", "rw-over-max", vsock(length=64 * 1024 + 1))
write("vsock_header", "request", vsock(op=1))
write("vsock_header", "response", vsock(op=2))
write("vsock_header", "rst", vsock(op=3))
write("vsock_header", "shutdown-both", vsock(op=4, flags=3))
write("vsock_header", "credit-update", vsock(op=6, fwd_cnt=4096))
write("vsock_header", "credit-request", vsock(op=7))
write("vsock_header", "wrong-src-cid", vsock(src_cid=7))
write("vsock_header", "dgram-type", vsock(kind=3))
write("vsock_header", "short-header", vsock()[:43])
write("vsock_header", "connect-line", b"CONNECT 1024")
write("vsock_header", "connect-line-cr", b"CONNECT 1024\r")
write("vsock_header", "connect-overflow", b"CONNECT 99999999999")

# block_request: 16-byte virtio-blk header, u64 capacity in sectors, read-only byte, then one
# 5-byte descriptor per buffer (u32 length, flags byte: bit 0 = device-writable).
def blk(kind, sector, capacity, read_only, descs):
    out = struct.pack("<IIQ", kind, 0, sector) + struct.pack("<QB", capacity, read_only)
    for length, writable in descs:
        out += struct.pack("<IB", length, writable)
    return out


HDR = (16, 0)
STATUS = (1, 1)
write("block_request", "read-one-sector", blk(0, 0, 2048, 1, [HDR, (512, 1), STATUS]))
write("block_request", "read-two-buffers", blk(0, 8, 2048, 1, [HDR, (512, 1), (1024, 1), STATUS]))
write("block_request", "read-past-end", blk(0, 2047, 2048, 1, [HDR, (1024, 1), STATUS]))
write("block_request", "read-partial-sector", blk(0, 0, 2048, 1, [HDR, (100, 1), STATUS]))
write("block_request", "write-read-only", blk(1, 0, 2048, 1, [HDR, (512, 0), STATUS]))
write("block_request", "write-writable", blk(1, 0, 2048, 0, [HDR, (512, 0), STATUS]))
write("block_request", "flush", blk(4, 0, 2048, 1, [HDR, STATUS]))
write("block_request", "get-id", blk(8, 0, 2048, 1, [HDR, (20, 1), STATUS]))
write("block_request", "discard", blk(11, 0, 2048, 1, [HDR, (16, 0), STATUS]))
write("block_request", "status-not-writable", blk(0, 0, 2048, 1, [HDR, (512, 1), (1, 0)]))
write("block_request", "sector-overflow", blk(0, 2**64 - 1, 2**64 - 1, 1, [HDR, (512, 1), STATUS]))

# virtqueue: queue-size byte (1 << (b % 9)), flags byte (bit 0: EVENT_IDX), then guest memory
# from address 0: descriptor table at 0x0, available ring at 0x1000, used ring at 0x2000,
# data from 0x3000; a second RAM region at 0x20000 after a hole.
F_NEXT, F_WRITE, F_INDIRECT = 1, 2, 4


def queue(size_exp, descs, heads, event_idx=False, extra=None):
    mem = bytearray(0x3000)
    for i, (addr, length, flags, nxt) in enumerate(descs):
        struct.pack_into("<QIHH", mem, 16 * i, addr, length, flags, nxt)
    struct.pack_into("<HH", mem, 0x1000, 0, len(heads))
    for i, h in enumerate(heads):
        struct.pack_into("<H", mem, 0x1004 + 2 * i, h)
    if extra:
        for at, blob in extra:
            if len(mem) < at + len(blob):
                mem.extend(b"\0" * (at + len(blob) - len(mem)))
            mem[at:at + len(blob)] = blob
    # Guest RAM starts zeroed: trailing zeros add nothing.
    return bytes([size_exp, 1 if event_idx else 0]) + bytes(mem).rstrip(b"\0")


write("virtqueue", "one-readable", queue(4, [(0x3000, 64, 0, 0)], [0]))
write("virtqueue", "read-then-write", queue(4, [(0x3000, 16, F_NEXT, 1), (0x3100, 512, F_WRITE | F_NEXT, 2), (0x3400, 1, F_WRITE, 0)], [0]))
write("virtqueue", "two-chains-event-idx", queue(4, [(0x3000, 16, 0, 0), (0x3100, 16, F_WRITE, 0)], [0, 1], event_idx=True))
write("virtqueue", "second-region", queue(4, [(0x20000, 4096, F_WRITE, 0)], [0]))
write("virtqueue", "into-the-hole", queue(4, [(0x10000, 16, 0, 0)], [0]))
write("virtqueue", "straddles-the-end", queue(4, [(0xfff0, 32, 0, 0)], [0]))
write("virtqueue", "loop", queue(4, [(0x3000, 16, F_NEXT, 1), (0x3100, 16, F_NEXT, 0)], [0]))
write("virtqueue", "next-out-of-table", queue(2, [(0x3000, 16, F_NEXT, 9)], [0]))
write("virtqueue", "head-out-of-table", queue(2, [(0x3000, 16, 0, 0)], [7]))
write("virtqueue", "avail-idx-ahead", queue(2, [(0x3000, 16, 0, 0)], [0, 0, 0, 0, 0]))
indirect = struct.pack("<QIHH", 0x3100, 16, F_NEXT, 1) + struct.pack("<QIHH", 0x3200, 64, F_WRITE, 0)
write("virtqueue", "indirect", queue(4, [(0x4000, len(indirect), F_INDIRECT, 0)], [0], extra=[(0x4000, indirect)]))
write("virtqueue", "indirect-odd-length", queue(4, [(0x4000, 24, F_INDIRECT, 0)], [0], extra=[(0x4000, indirect)]))
write("virtqueue", "max-queue-chain", queue(8, [(0x3000 + 16 * i, 16, F_NEXT, i + 1) for i in range(255)] + [(0x3000, 16, 0, 0)], [0]))


# agent_frames_from_host / client_frames_from_agent: a 4-byte little-endian length, then the
# postcard payload. ClientFrame: 0 = Hello { version (varint), token ([u8; 32]) }, 1 = Request.
def frame(payload):
    return struct.pack("<I", len(payload)) + payload


write("agent_frames_from_host", "hello-v3", frame(bytes([0, 3]) + bytes(32)))
write("agent_frames_from_host", "hello-v4", frame(bytes([0, 4]) + bytes(32)))
write("agent_frames_from_host", "hello-wrong-version", frame(bytes([0, 1]) + bytes(range(32))))
write("agent_frames_from_host", "request-ping", frame(bytes([1, 0])))
write("agent_frames_from_host", "unknown-request", frame(bytes([1, 120])))
# Request 13 = Resume { token ([u8; 32]), unix_nanos (varint), entropy ([u8; 32]),
# generation (varint) }: a restored VM's re-key and reseed (protocol 4).
write("agent_frames_from_host", "request-resume",
      frame(bytes([1, 13]) + bytes(range(32)) + bytes([0xac, 0x02]) + bytes(range(0x80, 0xa0)) + bytes([2])))
write("agent_frames_from_host", "oversized-length", struct.pack("<I", 0xFFFFFFFF) + bytes([0, 3]))
write("agent_frames_from_host", "short-header", bytes([34, 0]))
write("agent_frames_from_host", "two-frames",
      frame(bytes([0, 3]) + bytes(32)) + frame(bytes([1, 0])))
# AgentFrame: each small variant tag, empty and with a short byte payload.
for v in range(12):
    write("client_frames_from_agent", f"variant-{v}-empty", frame(bytes([v])))
    write("client_frames_from_agent", f"variant-{v}-bytes", frame(bytes([v, 5]) + b"hello"))
write("client_frames_from_agent", "oversized-length", struct.pack("<I", 0xFFFFFFFF) + bytes([1]))
write("client_frames_from_agent", "short-header", bytes([3]))

# snapshot_state: a state file (vmm/src/snapshot/format.rs): b"VMSNAPST", u32 version,
# u64 payload length, the postcard payload (a VmState: vmm/src/snapshot/state.rs), SHA-256
# of everything before it. The KVM structures are postcard byte strings of their ABI size.
import hashlib


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def blob(size, fill=b""):
    return varint(size) + fill.ljust(size, b"\0")[:size]


def vcpu_state(index, xsave=True):
    regs = bytearray(144)
    struct.pack_into("<QQ", regs, 128, 0x100000 + index, 2)  # rip, rflags
    fpu = bytes(128) + varint(0x37F) + varint(0) + bytes([0]) + varint(0) + varint(0) \
        + varint(0) + bytes(256) + varint(0x1F80)
    msrs = [(0x10, 1234), (0xC0000080, 0xD01), (0x1B, 0xFEE00900)]
    return (blob(4) + blob(144, bytes(regs)) + blob(312) + fpu
            + (bytes([1]) + blob(4096) if xsave else bytes([0]))
            + (bytes([1]) + blob(392) if xsave else bytes([0]))
            + blob(128) + blob(1024)
            + varint(len(msrs)) + b"".join(varint(i) + varint(d) for i, d in msrs)
            + blob(64))


# A virtio device (vmm/src/virtio/persist.rs): DeviceKind (0 Block { path, size, read_only },
# 1 Vsock { guest_cid }, 2 Rng), TransportState, then its queues (size, ready, desc, avail,
# used, next_avail, next_used, event_idx). Rings at 0x10000 + 0x10000 * i, as the harness.
def queue_state(i, size=256, next_idx=7, used=None):
    base = 0x10000 + 0x10000 * i
    used = base + 0x8000 if used is None else used
    return (varint(size) + bytes([1]) + varint(base) + varint(base + 0x4000) + varint(used)
            + varint(next_idx) + varint(next_idx) + bytes([0]))


def device(kind, queues, acked=1 << 32, fs=None):
    transport = (varint(0xF) + bytes([0]) + varint(acked) + varint(1) + varint(1) + varint(0)
                 + varint(0) + varint(1))  # status DRIVER_OK..., interrupt VRING
    session = bytes([0]) if fs is None else bytes([1]) + fs
    return kind + transport + varint(len(queues)) + b"".join(queues) + session


def blob_bytes(b):
    return varint(len(b)) + b


# DeviceKind 3 = Fs { tag, share, dax_window }; its FUSE session (vm_virtiofs::SessionState):
# open, FsState { next_node, next_fh, inodes [SavedInode { nodeid, parent, name, dev, ino,
# nlookup }], handles [SavedHandle { fh, nodeid, dir }] }, mappings [ChunkMapping { moffset,
# nodeid, foffset, file_len }].
FS = bytes([3]) + blob_bytes(b"fs0") + blob_bytes(b"/srv/models") + varint(64 << 20)
FS_SESSION = (bytes([1]) + varint(4) + varint(2)
              + varint(2) + varint(2) + varint(1) + blob_bytes(b"sub") + varint(2049) + varint(77)
              + varint(1)
              + varint(3) + varint(2) + blob_bytes(b"model.gguf") + varint(2049) + varint(78)
              + varint(2)
              + varint(1) + varint(1) + varint(3) + bytes([0])
              + varint(1) + varint(0) + varint(3) + varint(0) + varint(2 << 20))


RNG = bytes([2])
BLOCK = bytes([0]) + varint(len(b"/disk.img")) + b"/disk.img" + varint(1 << 20) + bytes([1])
VSOCK = bytes([1]) + varint(3)
DEVICES = [device(RNG, [queue_state(0)]), device(BLOCK, [queue_state(1)]),
           device(VSOCK, [queue_state(2), queue_state(3), queue_state(4)])]


def vm_state(vcpus=1, mem_mib=16, regions=None, states=None, xsave=True, devices=()):
    regions = regions if regions is not None else [(0, mem_mib << 20)]
    states = states if states is not None else vcpus
    return (bytes([vcpus]) + varint(mem_mib) + varint(2)  # CpuProfile::Baseline
            + varint(len(regions)) + b"".join(varint(a) + varint(s) for a, s in regions)
            + varint(states) + b"".join(vcpu_state(i, xsave) for i in range(states))
            + blob(520) + blob(520, b"\1") + blob(520, b"\2") + blob(112) + blob(48)
            + varint(len(devices)) + b"".join(devices))


def state_file(payload, version=3, magic=b"VMSNAPST", length=None):
    length = len(payload) if length is None else length
    body = magic + struct.pack("<IQ", version, length) + payload
    return body + hashlib.sha256(body).digest()


VALID = state_file(vm_state())
write("snapshot_state", "valid-1vcpu", VALID)
write("snapshot_state", "valid-2vcpus-no-xsave", state_file(vm_state(vcpus=2, xsave=False)))
write("snapshot_state", "bad-magic", state_file(vm_state(), magic=b"VMSNAPSX"))
write("snapshot_state", "version-1", state_file(vm_state(), version=1))
write("snapshot_state", "version-2", state_file(vm_state(), version=2))
write("snapshot_state", "huge-length", state_file(vm_state(), length=2**64 - 1))
write("snapshot_state", "truncated", VALID[:len(VALID) // 2])
write("snapshot_state", "short-header", VALID[:19])
write("snapshot_state", "trailing-bytes", VALID + b"\0\0\0")
write("snapshot_state", "checksum-flipped", VALID[:100] + bytes([VALID[100] ^ 1]) + VALID[101:])
write("snapshot_state", "zero-vcpus", state_file(vm_state(vcpus=0, states=0)))
write("snapshot_state", "vcpu-count-mismatch", state_file(vm_state(vcpus=2, states=1)))
write("snapshot_state", "regions-overlap",
      state_file(vm_state(regions=[(0, 8 << 20), (4 << 20, 8 << 20)])))
write("snapshot_state", "region-outside-layout", state_file(vm_state(regions=[(0, 32 << 20)])))
write("snapshot_state", "huge-sequence", state_file(bytes([1]) + varint(16) + varint(2)
                                                     + varint(2**32 - 1)))
write("snapshot_state", "valid-devices", state_file(vm_state(devices=DEVICES)))
write("snapshot_state", "device-queue-size",
      state_file(vm_state(devices=[device(RNG, [queue_state(0, size=512)])])))
write("snapshot_state", "device-queue-address",
      state_file(vm_state(devices=[device(RNG, [queue_state(0, used=(16 << 20) - 8)])])))
write("snapshot_state", "device-features",
      state_file(vm_state(devices=[device(RNG, [queue_state(0)], acked=(1 << 32) | 1)])))
write("snapshot_state", "device-queue-count",
      state_file(vm_state(devices=[device(RNG, [queue_state(0), queue_state(1)])])))
write("snapshot_state", "valid-fs-session",
      state_file(vm_state(devices=[device(FS, [queue_state(0), queue_state(1)], fs=FS_SESSION)])))
write("snapshot_state", "fs-without-session",
      state_file(vm_state(devices=[device(FS, [queue_state(0), queue_state(1)])])))
write("snapshot_state", "session-on-rng",
      state_file(vm_state(devices=[device(RNG, [queue_state(0)], fs=FS_SESSION)])))
write("snapshot_state", "too-many-devices",
      state_file(vm_state(devices=[device(RNG, [queue_state(0)])] * 20)))
# The target also frames its input as a payload: bare payloads reach the decoder directly.
write("snapshot_state", "payload-valid-1vcpu", vm_state())
write("snapshot_state", "payload-valid-2vcpus", vm_state(vcpus=2))


# virtiofs_request: a room byte (16 << (b % 17) bytes of reply room), then records of a u16
# length and one FUSE request (a 40-byte fuse_in_header + arguments). The target answers an
# INIT first; lookups then give node ids 2, 3, ... and opens handles 1, 2, ...
def fuse(opcode, nodeid, body=b"", unique=1, length=None):
    n = 40 + len(body) if length is None else length
    return struct.pack("<IIQQIIIHH", n, opcode, unique, nodeid, 0, 0, 0, 0, 0) + body


def fuse_seq(room_exp, *reqs):
    out = bytes([room_exp])
    for r in reqs:
        out += struct.pack("<H", len(r)) + r
    return out


LOOKUP, FORGET, GETATTR, READLINK, OPEN, READ, STATFS, RELEASE = 1, 2, 3, 5, 14, 15, 17, 18
GETXATTR, LISTXATTR, INIT, OPENDIR, READDIR, DESTROY = 22, 23, 26, 27, 28, 38
BATCH_FORGET, READDIRPLUS, LSEEK, SETUPMAPPING, REMOVEMAPPING = 42, 44, 46, 48, 49
read_in = lambda fh, off, size: struct.pack("<QQIIQII", fh, off, size, 0, 0, 0, 0)
open_in = struct.pack("<II", 0, 0)
lookup_a = fuse(LOOKUP, 1, b"a\0")
write("virtiofs_request", "lookup-open-read",
      fuse_seq(16, lookup_a, fuse(OPEN, 2, open_in), fuse(READ, 2, read_in(1, 0, 4096))))
write("virtiofs_request", "read-oversized",
      fuse_seq(12, lookup_a, fuse(OPEN, 2, open_in), fuse(READ, 2, read_in(1, 0, 2**32 - 1))))
write("virtiofs_request", "readdirplus",
      fuse_seq(12, fuse(OPENDIR, 1, open_in), fuse(READDIRPLUS, 1, read_in(1, 0, 4096)),
               fuse(READDIR, 1, read_in(1, 2, 4096))))
write("virtiofs_request", "symlinks",
      fuse_seq(12, fuse(LOOKUP, 1, b"out\0"), fuse(READLINK, 2), fuse(LOOKUP, 2, b"passwd\0"),
               fuse(LOOKUP, 1, b"in\0"), fuse(READLINK, 3)))
write("virtiofs_request", "names",
      fuse_seq(12, fuse(LOOKUP, 1, b"..\0"), fuse(LOOKUP, 1, b"sub/b\0"), fuse(LOOKUP, 1, b"x"),
               fuse(LOOKUP, 1, b"y" * 300 + b"\0")))
write("virtiofs_request", "forget-storm",
      fuse_seq(8, lookup_a, *[fuse(FORGET, n, struct.pack("<Q", 2**64 - 1)) for n in (2, 1, 99)],
               fuse(BATCH_FORGET, 0, struct.pack("<IIQQ", 2**32 - 1, 0, 2, 1)),
               fuse(BATCH_FORGET, 0, struct.pack("<IIQQ", 1, 0, 1, 1))))
write("virtiofs_request", "dax",
      fuse_seq(12, lookup_a, fuse(OPEN, 2, open_in),
               fuse(SETUPMAPPING, 2, struct.pack("<QQQQQ", 1, 0, 2 << 20, 0, 0)),
               fuse(SETUPMAPPING, 2, struct.pack("<QQQQQ", 1, 0, 2 << 20, 1, 0)),
               fuse(SETUPMAPPING, 2, struct.pack("<QQQQQ", 1, 1 << 40, 2 << 20, 0, 62 << 20)),
               fuse(SETUPMAPPING, 2, struct.pack("<QQQQQ", 1, 0, 2 << 20, 0, 64 << 20)),
               fuse(REMOVEMAPPING, 2, struct.pack("<IQQ", 1, 0, 2 << 20)),
               fuse(REMOVEMAPPING, 2, struct.pack("<I", 2**32 - 1))))
write("virtiofs_request", "writes-and-unknown",
      fuse_seq(12, *[fuse(op, 1, b"\0" * 64) for op in (4, 6, 8, 9, 10, 12, 16, 21, 35, 20, 999)]))
write("virtiofs_request", "xattrs-statfs-lseek",
      fuse_seq(12, lookup_a, fuse(GETXATTR, 2, struct.pack("<II", 0, 0) + b"user.x\0"),
               fuse(LISTXATTR, 2, struct.pack("<II", 0, 0)), fuse(STATFS, 1),
               fuse(OPEN, 2, open_in), fuse(LSEEK, 2, struct.pack("<QQII", 1, 0, 3, 0))))
write("virtiofs_request", "lying-lengths",
      fuse_seq(12, fuse(STATFS, 1, length=200), fuse(GETATTR, 1)[:20], fuse(INIT, 0, b"\0" * 8),
               fuse(DESTROY, 0), fuse(GETATTR, 1, b"\0" * 16)))
