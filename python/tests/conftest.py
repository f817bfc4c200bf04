"""Shared by the SDK's tests: one booted sandbox for the tests that only run commands in
one, the no-driver rule of the Rust suites, and the skip records ci/test.sh counts.

- A test that needs a guest boots on whatever driver this host has (``allow_emulation=True``).
  When none can boot one (no driver, no built guest image) it **fails**, as the Rust e2e tests
  do (test-support's no-driver rule), unless ``VM_TEST_ALLOW_NO_DRIVER=1`` says this host
  truly has none: then it is skipped, with its reason.
- Every skipped test is written to ``$VM_TEST_SKIP_LOG`` as ``SKIP python::<test>: <reason>``
  (ci/test.sh lists and counts those lines); nothing is skipped silently.
"""

import os
import shutil

import pytest

import vm_sandbox
from vm_sandbox import ImageError, NoDriver

ALLOW_NO_DRIVER = "VM_TEST_ALLOW_NO_DRIVER"


def _no_guest(reason: str) -> None:
    msg = (
        f"no driver can boot a guest on this host ({reason}); a test that boots on whatever "
        f"driver is available fails when none ran (set {ALLOW_NO_DRIVER}=1 only on a host "
        "that truly has none)"
    )
    if os.environ.get(ALLOW_NO_DRIVER) == "1":
        pytest.skip(reason)
    pytest.fail(msg, pytrace=False)


def boot(**kwargs):
    """A sandbox on whatever driver this host has, or the no-driver rule."""
    kwargs.setdefault("allow_emulation", True)
    try:
        return vm_sandbox.Sandbox(**kwargs)
    except (NoDriver, ImageError) as e:
        _no_guest(str(e))
        raise


@pytest.fixture(scope="session")
def guest_host():
    """This host can boot a guest (else the no-driver rule): for tests that boot their own
    sandboxes some other way (``AsyncSandbox``)."""
    boot(memory="128M").close()


@pytest.fixture(scope="session")
def sb():
    """One sandbox shared by the tests that only run commands and move files."""
    box = boot(memory="512M")
    yield box
    box.close()


@pytest.fixture
def fresh():
    """A factory of sandboxes closed when the test ends."""
    made = []

    def make(**kwargs):
        box = boot(**kwargs)
        made.append(box)
        return box

    yield make
    for box in made:
        box.close()


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def vm_bin():
    """The ``vm`` CLI the workspace built: ``$VM_BIN``, else ``vm`` in ``$CARGO_TARGET_DIR`` (or
    ``target/``) ``debug``/``release``, else ``vm`` on ``PATH``; none fails the test."""
    if os.environ.get("VM_BIN"):
        return os.environ["VM_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    for profile in ("debug", "release"):
        path = os.path.join(target, profile, "vm")
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("vm")
    if not found:
        pytest.fail(f"no vm CLI: build it (cargo build -p vm-cli) or set VM_BIN; looked in {target}")
    return found


def descendants(pid=None):
    """Every live process below ``pid`` (this process by default), from /proc."""
    pid = pid or os.getpid()
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        parent[int(entry)] = int(fields[1])
    out = set()
    for p in parent:
        q = p
        while q in parent and q > 1:
            q = parent[q]
            if q == pid:
                out.add(p)
                break
    return out


def pytest_runtest_logreport(report):
    if not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    line = f"SKIP python::{report.nodeid}: {reason}"
    print(line)
    log = os.environ.get("VM_TEST_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")
