"""Named VMs started by the ``vm`` CLI (``vm run -d --name NAME``): ``vm_sandbox.ps()`` lists
them, ``Sandbox.attach``/``AsyncSandbox.attach`` reach them, closing an attached sandbox leaves
the VM running, pausing goes through the VM's holder, and a missing, stopped or badly named VM
raises its own error naming it.

The CLI is the one the workspace built: ``$VM_BIN``, else ``vm`` in ``$CARGO_TARGET_DIR``
(or ``target/``) ``debug``/``release``, else ``vm`` on ``PATH``; none fails the test. Each test
uses a private runtime state directory (``VM_RUNTIME_DIR``) shared by the CLI and the SDK.
"""

import asyncio
import json
import os
import shutil
import subprocess
import tempfile

import pytest
from conftest import vm_bin

from vm_sandbox import (
    AsyncSandbox,
    GuestError,
    NoSuchVm,
    NotRunning,
    Paused,
    Sandbox,
    SpecRefused,
    ps,
)

@pytest.fixture
def vm(monkeypatch):
    """Runs the CLI against a private runtime directory (short: it holds the VM's sockets)."""
    rt = tempfile.mkdtemp(prefix="vmrt-", dir="/tmp")
    monkeypatch.setenv("VM_RUNTIME_DIR", rt)
    binary = vm_bin()
    started = []

    def run(*args, check=True):
        if args[:2] == ("run", "-d"):
            started.append(args[args.index("--name") + 1])
        p = subprocess.run([binary, *args], capture_output=True, timeout=600)
        if check:
            assert p.returncode == 0, (args, p.returncode, p.stderr.decode())
        return p

    yield run
    for name in started:
        run("rm", "-f", name, check=False)
    shutil.rmtree(rt, ignore_errors=True)


def _alive(pids):
    return [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_attach_to_a_vm_run_d_vm_and_detach(vm, guest_host):
    vm("run", "-d", "--name", "pybox", "--allow-emulation", "-e", "MODE=attached", "-w", "/tmp")
    infos = ps()
    assert [i.name for i in infos] == ["pybox"]
    info = infos[0]
    assert info.state == "running"
    assert info.driver in ("tcg", "kvm")
    assert info.uptime is not None and info.uptime >= 0
    assert info.supervisor_pid and info.host_pids and _alive(info.host_pids) == info.host_pids
    cli_ps = json.loads(vm("ps", "--json").stdout)
    assert cli_ps[0]["supervisor_pid"] == info.supervisor_pid
    assert cli_ps[0]["state"] == info.state and cli_ps[0]["driver"] == info.driver

    with Sandbox.attach("pybox") as sb:
        assert sb.attached and sb.name == "pybox" and sb.driver == info.driver
        r = sb.exec(["sh", "-c", "echo $MODE; pwd; echo oops >&2; exit 3"])
        # The VM's environment and `-w` default apply, as with `vm exec pybox`.
        assert (r.exit_code, r.stdout, r.stderr) == (3, b"attached\n/tmp\n", b"oops\n")
        events = [ev.kind for ev in sb.exec_stream(["sh", "-c", "echo a; echo b >&2"])]
        assert events[-1] == "exit" and {"stdout", "stderr"} <= set(events)
        sb.files.write("from-sdk.txt", b"written by the SDK")
        assert sb.files.read("from-sdk.txt") == b"written by the SDK"
        assert "from-sdk.txt" in sb.files.list()
    # Detached only: the same VM answers the CLI, with the SDK's file in it.
    assert _alive(info.host_pids) == info.host_pids
    out = vm("exec", "pybox", "--", "cat", "/work/from-sdk.txt")
    assert out.stdout == b"written by the SDK"
    assert [(i.name, i.state) for i in ps()] == [("pybox", "running")]
    with pytest.raises(GuestError, match="detached"):
        sb.exec(["true"])

    async def attach_async():
        sb = await AsyncSandbox.attach("pybox")
        try:
            return await sb.exec(["echo", "async"])
        finally:
            await sb.close()

    assert asyncio.run(attach_async()).stdout == b"async\n"
    assert vm("exec", "pybox", "--", "true").returncode == 0

    # Pause and resume through the VM's holder, seen by the CLI and by other handles.
    sb = Sandbox.attach("pybox")
    sb.pause()
    assert [i.state for i in ps()] == ["paused"]
    with pytest.raises(Paused, match="pybox"):
        sb.exec(["true"])
    with pytest.raises(Paused, match="pybox"):
        Sandbox.attach("pybox")
    sb.resume()
    assert sb.exec(["echo", "back"]).stdout == b"back\n"

    # Stopped by the CLI: the handle and a new attach say so, naming the VM.
    vm("stop", "pybox")
    assert _alive(info.host_pids) == []
    with pytest.raises(NotRunning, match="pybox is exited"):
        sb.exec(["true"])
    with pytest.raises(NotRunning, match="pybox"):
        Sandbox.attach("pybox")
    assert [(i.name, i.state) for i in ps()] == [("pybox", "exited")]
    vm("rm", "pybox")
    assert ps() == []
    with pytest.raises(NoSuchVm, match='"pybox"'):
        Sandbox.attach("pybox")


def test_attach_to_a_missing_or_bad_name_raises(vm):
    with pytest.raises(NoSuchVm) as e:
        Sandbox.attach("no-such-vm")
    assert isinstance(e.value, LookupError)
    assert '"no-such-vm"' in str(e.value) and "vm ps" in str(e.value)
    with pytest.raises(NoSuchVm, match="no-such-vm"):
        asyncio.run(AsyncSandbox.attach("no-such-vm"))
    with pytest.raises(SpecRefused) as e:
        Sandbox.attach("../etc")
    assert e.value.field == "name" and "invalid VM name" in str(e.value)
    assert ps() == []
