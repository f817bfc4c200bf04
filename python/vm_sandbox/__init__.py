"""vm_sandbox: run untrusted code in a microVM from Python.

The Python face of the ``vm`` runtime's Rust API (``vm-sandbox``): the spec is built and
validated exactly as the ``vm`` CLI builds it, so names, defaults and refusals are the CLI's.

    from vm_sandbox import Sandbox

    with Sandbox(memory="512M", timeout="10m", allow_emulation=True) as sb:
        r = sb.exec(["sh", "-c", "echo $((6*7))"])
        assert r.exit_code == 0 and r.stdout == b"42\\n"

A VM a ``vm run -d --name box`` started: ``vm_sandbox.ps()`` lists it,
``Sandbox.attach("box")`` reaches it (closing that only detaches).
"""

import os as _os

# The VM processes the drivers start, shipped in the wheel (vm_sandbox/bin): found through the
# variables the drivers read, unless the caller names others.
for _var, _name in (("VM_VMM_BIN", "vm-vmm"), ("VM_VSOCK_BIN", "vm-vsock")):
    _path = _os.path.join(_os.path.dirname(__file__), "bin", _name)
    if _os.access(_path, _os.X_OK):
        _os.environ.setdefault(_var, _path)

from . import images  # noqa: E402
from ._async import AsyncFiles, AsyncSandbox
from ._errors import (
    BootFailed,
    CommandFailed,
    GuestError,
    ImageError,
    NoDriver,
    NoSuchVm,
    NotRunning,
    PathRefused,
    Paused,
    ServeFailed,
    SpecRefused,
    VmError,
    WallExpired,
)
from ._sandbox import (
    MAX_OUTPUT,
    ExecResult,
    Files,
    Sandbox,
    Server,
    Stream,
    StreamEvent,
    VmInfo,
    drivers,
    ps,
)


class Trust:
    """Trust levels (``Sandbox(trust=...)``), as the CLI's ``--trust``."""

    UNTRUSTED = "untrusted"
    SEMI = "semi"
    TRUSTED = "trusted"


__all__ = [
    "AsyncFiles",
    "AsyncSandbox",
    "BootFailed",
    "CommandFailed",
    "ExecResult",
    "Files",
    "GuestError",
    "ImageError",
    "MAX_OUTPUT",
    "NoDriver",
    "NoSuchVm",
    "NotRunning",
    "PathRefused",
    "Paused",
    "Sandbox",
    "Server",
    "ServeFailed",
    "SpecRefused",
    "Stream",
    "StreamEvent",
    "Trust",
    "VmError",
    "VmInfo",
    "WallExpired",
    "drivers",
    "images",
    "ps",
]
