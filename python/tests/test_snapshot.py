"""Snapshots from the SDK on this host. ``Sandbox(snapshots=DIR)`` on the tcg driver (which
cannot save a VM: QEMU 7.2 will not migrate its vhost-user vsock device) is refused with that
reason before anything boots; ``Sandbox.restore`` of a directory that holds no snapshot names
the file it could not read and starts nothing. A restore that succeeds needs kvm: the nested
kvm road (ci/kvm-nested.sh) restores through the same library calls, from the CLI."""

import pytest

import vm_sandbox
from vm_sandbox import Sandbox, VmError

from conftest import boot, descendants


def _tcg_available():
    return any(d["name"] == "tcg" and d["available"] for d in vm_sandbox.drivers())


def test_tcg_refuses_a_snapshot_sandbox_with_qemus_reason(tmp_path, guest_host):
    if not _tcg_available():
        pytest.fail("the guest host has no tcg driver to refuse snapshots", pytrace=False)
    before = descendants()
    runs, store = tmp_path / "runs", tmp_path / "snapshots"
    with pytest.raises(VmError) as e:
        boot(driver="tcg", snapshots=str(store), run_dir=str(runs))
    assert "tcg: no snapshots: QEMU 7.2 refuses to migrate a vhost-user-vsock device" in str(e.value)
    assert not runs.exists() or not any(runs.iterdir()), "a refused sandbox leaves no run dir"
    assert not store.exists() or not any(store.iterdir()), "nothing is staged"
    assert descendants() - before == set(), "a refused sandbox starts no process"


def test_a_snapshot_of_a_sandbox_not_made_for_it_is_refused_and_it_runs_on(sb, tmp_path):
    with pytest.raises(VmError, match=r"not booted for snapshots"):
        sb.snapshot(tmp_path / "snap")
    assert not (tmp_path / "snap").exists()
    assert sb.exec(["echo", "still"]).stdout == b"still\n"
    assert sb.generation == 0, "a booted sandbox has no restore behind it"


def test_restoring_a_directory_without_a_snapshot_names_the_record(tmp_path):
    before = descendants()
    (tmp_path / "empty").mkdir()
    with pytest.raises(VmError) as e:
        Sandbox.restore(tmp_path / "empty", allow_emulation=True, run_dir=str(tmp_path / "runs"))
    assert "snapshot.json" in str(e.value), str(e.value)
    assert not (tmp_path / "runs").exists()
    assert descendants() - before == set()


def test_restoring_a_snapshot_others_could_write_is_refused_naming_it(tmp_path):
    before = descendants()
    snap = tmp_path / "open"
    snap.mkdir()
    (snap / "snapshot.json").write_text("{}")
    snap.chmod(0o777)
    with pytest.raises(VmError) as e:
        Sandbox.restore(snap, allow_emulation=True, run_dir=str(tmp_path / "runs"))
    assert f"{snap} must belong to uid" in str(e.value), str(e.value)
    assert "writable by group or others (mode 0777)" in str(e.value), str(e.value)
    assert not (tmp_path / "runs").exists()
    assert descendants() - before == set()
