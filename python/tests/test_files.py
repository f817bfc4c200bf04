"""Files in a real guest: round trips, streaming of large files, confinement."""

import hashlib
import os
import resource
import subprocess

import pytest

from vm_sandbox import GuestError, PathRefused


def test_round_trip_with_sha256(sb):
    data = os.urandom(3 << 20)
    sb.files.write("in/data.bin", data)
    assert sb.files.read("in/data.bin") == data
    assert sb.files.read("/work/in/data.bin") == data, "absolute under the root"
    guest_sum = sb.exec(["sha256sum", "in/data.bin"]).stdout.split()[0].decode()
    assert guest_sum == hashlib.sha256(data).hexdigest()
    sb.files.write("in/a.txt", "abc")
    assert "in/a.txt" in sb.files.list("in")
    assert "in/data.bin" in sb.files.list("")


def test_confinement(sb):
    for bad in ["../x", "in/../../x", "/etc/passwd", "/workx/a", ""]:
        with pytest.raises(PathRefused):
            sb.files.read(bad)
        with pytest.raises(ValueError):
            sb.files.write(bad, b"x")
    with pytest.raises(PathRefused):
        sb.files.list("../")


def test_remove_takes_a_file_or_a_link_and_refuses_a_directory(sb):
    sb.files.write("rm/a.txt", b"a")
    sb.exec(["ln", "-s", "/work/rm/a.txt", "/work/rm/link"])
    sb.files.remove("rm/link")
    assert sb.files.read("rm/a.txt") == b"a", "a link's target stays"
    sb.files.remove("/work/rm/a.txt")
    assert sb.files.list("rm") == []
    with pytest.raises(GuestError):
        sb.files.remove("rm")
    with pytest.raises(GuestError):
        sb.files.remove("rm/a.txt")
    for bad in ["../x", "/etc/passwd", ""]:
        with pytest.raises(PathRefused):
            sb.files.remove(bad)
    assert sb.exec(["test", "-d", "/work/rm"]).exit_code == 0


def _peak_rss_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_64_mib_streams_with_flat_memory(sb, tmp_path):
    src = tmp_path / "big.bin"
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(64):
            chunk = os.urandom(1 << 20)
            h.update(chunk)
            f.write(chunk)
    before = _peak_rss_kib()
    assert sb.files.upload(src, "big.bin") == 64 << 20
    dst = tmp_path / "back.bin"
    assert sb.files.download("big.bin", dst) == 64 << 20
    grown_mib = (_peak_rss_kib() - before) / 1024
    assert grown_mib < 64, f"peak RSS grew {grown_mib:.1f} MiB streaming 64 MiB"
    out = subprocess.run(["sha256sum", str(dst)], capture_output=True, check=True).stdout
    assert out.split()[0].decode() == h.hexdigest()
    guest = sb.exec(["sha256sum", "big.bin"]).stdout.split()[0].decode()
    assert guest == h.hexdigest()
    sb.exec(["rm", "big.bin"], check=True)
