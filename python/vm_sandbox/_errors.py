"""The exception tree of ``vm_sandbox``, mapped from the Rust error enums.

Every exception carries the Rust cause chain on one line as its message. A refusal
(``SpecRefused``) also says which field it refuses in ``.field``
(``guarantees.mounts[0].read_only``, ``allow_emulation``, ``memory``, ``ports``).

A command's non-zero exit is a result, not an exception; ``check=True`` raises
``CommandFailed`` (like ``subprocess.run(check=True)``).
"""

from typing import Optional


class VmError(Exception):
    """Base class of every vm_sandbox error."""

    def __init__(self, message: str, field: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class SpecRefused(VmError, ValueError):
    """The spec (or an argument) was refused before anything booted; ``.field`` names it."""


class PathRefused(VmError, ValueError):
    """A guest path is outside the sandbox's root (``../x``, ``/etc/passwd``)."""


class NoDriver(VmError):
    """No driver on this host can contain the work (see ``vm_sandbox.drivers()``)."""


class NoSuchVm(VmError, LookupError):
    """No named VM has that name (``Sandbox.attach``; see ``vm_sandbox.ps()``)."""


class NotRunning(VmError):
    """The named VM is not running (exited, stopping, still starting); the message says why."""


class BootFailed(VmError):
    """The VM did not boot (the driver's reason is in the message)."""


class GuestError(VmError):
    """The guest agent failed an operation (I/O, a closed VM, a guest-side refusal)."""


class WallExpired(VmError):
    """The VM's wall lifetime (``timeout=``) expired; the VM is gone."""


class Paused(VmError):
    """The VM is paused; ``resume()`` it first."""


class ServeFailed(VmError):
    """A served process exited before it was ready, or was not ready in time."""


class ImageError(VmError):
    """A guest image or an OCI image could not be found, pulled or imported."""


class CommandFailed(VmError):
    """``exec(..., check=True)``: the command exited non-zero; ``.result`` has its output."""

    def __init__(self, message: str, field: Optional[str] = None, result: "object" = None) -> None:
        super().__init__(message, field)
        self.result = result
