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
write("agent_frames_from_host", "hello-wrong-version", frame(bytes([0, 1]) + bytes(range(32))))
write("agent_frames_from_host", "request-ping", frame(bytes([1, 0])))
write("agent_frames_from_host", "unknown-request", frame(bytes([1, 120])))
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
