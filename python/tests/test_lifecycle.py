"""Sandboxes coming and going: refusals before boot, teardown, many at once, wall time,
pause, drivers."""

import concurrent.futures
import os
import time

import pytest

import vm_sandbox
from vm_sandbox import Paused, Sandbox, SpecRefused, WallExpired

from conftest import boot, descendants


def _hardware_virt():
    return any(d["name"] == "kvm" and d["available"] for d in vm_sandbox.drivers())


REFUSALS = [
    (dict(mounts={"/tmp": "/data:rw"}, allow_emulation=True), "read_only"),
    (dict(dax_window=-2, allow_emulation=True), "dax_window"),
    (dict(env={"API_TOKEN": "x"}, allow_emulation=True), "guarantees.env"),
    (dict(memory="12X", allow_emulation=True), "memory"),
    (dict(memory=0, allow_emulation=True), "mem_mib"),
    (dict(mounts={"relative/dir": "/data"}, allow_emulation=True), "guarantees.mounts"),
    (dict(trust="nonsense", allow_emulation=True), "trust"),
]


@pytest.mark.parametrize("kwargs,field", REFUSALS, ids=[f for _, f in REFUSALS])
def test_refused_spec_boots_nothing(kwargs, field, tmp_path):
    before = descendants()
    runs = tmp_path / "runs"
    with pytest.raises(SpecRefused) as e:
        Sandbox(run_dir=str(runs), **kwargs)
    assert isinstance(e.value, ValueError)
    assert field in (e.value.field or ""), (e.value.field, str(e.value))
    assert field in str(e.value)
    assert not runs.exists(), "a refused spec creates no run directory"
    assert descendants() - before == set(), "a refused spec starts no process"


def test_a_dax_window_where_there_is_none_is_refused_and_none_reads_the_mount(tmp_path, guest_host):
    share = tmp_path / "share"
    share.mkdir()
    (share / "w").write_bytes(b"weights\n")
    mounts = {str(share): "/m"}
    if _hardware_virt():
        with boot(mounts=mounts, dax_window="64M") as sb:
            assert sb.exec(["cat", "/m/w"]).stdout == b"weights\n"
        return
    before = descendants()
    runs = tmp_path / "runs"
    with pytest.raises(vm_sandbox.VmError) as e:
        boot(mounts=mounts, dax_window="64M", run_dir=str(runs))
    assert not isinstance(e.value, vm_sandbox.BootFailed), "refused before a boot is tried"
    assert "dax_window_mib: 64 MiB asked for" in str(e.value) and "no DAX window" in str(e.value)
    assert descendants() - before == set()
    assert not runs.exists(), "a refused window creates no run directory"
    with boot(mounts=mounts, dax_window=0) as sb:
        assert sb.exec(["cat", "/m/w"]).stdout == b"weights\n"


def test_untrusted_work_needs_allow_emulation_without_hardware_virt(tmp_path):
    if _hardware_virt():
        with Sandbox() as sb:
            assert sb.containment == "microvm"
        return
    before = descendants()
    with pytest.raises(SpecRefused) as e:
        Sandbox(run_dir=str(tmp_path / "runs"))
    assert e.value.field == "allow_emulation", str(e.value)
    assert "allow_emulation=True" in str(e.value)
    assert descendants() - before == set()


def test_a_raising_with_block_leaves_no_process_or_run_dir(tmp_path):
    before = descendants()
    with pytest.raises(RuntimeError, match="inside"):
        with boot(run_dir=str(tmp_path / "runs")) as sb:
            pids = sb.host_pids()
            run_dir = sb.run_dir
            assert pids and os.path.isdir(run_dir)
            assert sb.exec(["true"]).ok
            raise RuntimeError("inside")
    assert not os.path.exists(run_dir)
    assert not _alive(pids)
    assert descendants() - before == set()


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_eight_sandboxes_from_eight_threads():
    def one(i):
        with boot(memory="128M") as sb:
            return sb.exec(["sh", "-c", f"echo {i}"]).stdout

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(8)))
    assert outs == [f"{i}\n".encode() for i in range(8)]


def test_wall_lifetime_expires(fresh):
    sb = fresh(timeout="5s", memory="128M")
    pids = sb.host_pids()
    assert pids
    with pytest.raises(WallExpired):
        sb.exec(["sleep", "120"])
    deadline = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pids), "the expired VM is torn down"


def _alive(pids):
    return [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]


def test_pause_and_resume(fresh):
    sb = fresh(memory="128M")
    assert sb.exec(["true"]).ok
    sb.pause()
    with pytest.raises(Paused):
        sb.exec(["true"])
    sb.resume()
    assert sb.exec(["echo", "back"]).stdout == b"back\n"


def test_drivers_report_every_driver():
    ds = vm_sandbox.drivers()
    names = [d["name"] for d in ds]
    assert {"kvm", "tcg"} <= set(names), names
    for d in ds:
        assert set(d) == {"name", "available", "containment", "jail", "reason"}
        assert isinstance(d["available"], bool) and d["reason"]
