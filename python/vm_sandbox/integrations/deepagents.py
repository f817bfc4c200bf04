"""A sandbox backend for LangChain's Deep Agents: the agent's ``execute`` tool and its file tools
(``ls``, ``read_file``, ``write_file``, ``edit_file``, ``glob``, ``grep``) run in one ``vm``
microVM (no network device, read-only mounts, capped memory and lifetime).

    from deepagents import create_deep_agent
    from vm_sandbox.integrations.deepagents import VmSandboxBackend

    with VmSandboxBackend(image="127.0.0.1:5000/python:3.11", allow_emulation=True) as backend:
        agent = create_deep_agent(model=model, backend=backend)
        agent.invoke({"messages": [{"role": "user", "content": "..."}]})

Deep Agents' ``BaseSandbox`` runs its file tools as small ``python3`` programs in the sandbox, so
the image needs python3 (the built-in image has none: give ``image=`` or ``rootfs=``). Closing
the backend (or leaving the ``with``) powers the VM off; a backend given an existing
``Sandbox`` leaves it to its owner.

Tested with ``deepagents`` in :data:`TESTED_WITH` (the ``deepagents`` extra's range).
"""

from __future__ import annotations

import uuid
from typing import Any, List, Optional, Tuple

try:
    from deepagents.backends.protocol import (
        ExecuteResponse,
        FileDownloadResponse,
        FileUploadResponse,
    )
    from deepagents.backends.sandbox import BaseSandbox
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "vm_sandbox.integrations.deepagents needs Deep Agents: pip install 'vm-sandbox[deepagents]'"
    ) from e

from .. import Sandbox, VmError

#: The framework range this backend was tested with (the ``deepagents`` extra's).
TESTED_WITH = "deepagents>=0.7.32,<0.8"

#: The most bytes of a command's output ``execute`` returns (Deep Agents' own inline limit
#: is smaller; this bounds what crosses from the VM).
MAX_OUTPUT = 1 << 20

_UPLOAD = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
_DOWNLOAD = 'if [ -d "$1" ]; then echo is_directory >&2; exit 3; fi; [ -e "$1" ] || exit 2; exec cat -- "$1"'


class VmSandboxBackend(BaseSandbox):
    """Deep Agents' sandbox backend on a ``vm`` microVM. Takes ``vm_sandbox.Sandbox``'s keyword
    arguments (``image``, ``rootfs``, ``memory``, ``timeout`` for the VM's whole lifetime,
    ``mounts`` always read-only, ``env``, ``allow_emulation``, ...) and boots at once; or
    ``sandbox=`` an existing one. ``command_timeout`` bounds each ``execute`` (seconds) when the
    agent gives none."""

    def __init__(self, sandbox: Optional[Sandbox] = None, *, command_timeout: int = 300, **kwargs: Any) -> None:
        kwargs.setdefault("memory", "512M")
        kwargs.setdefault("timeout", "30m")
        self._owned = sandbox is None
        self._sb = sandbox if sandbox is not None else Sandbox(**kwargs)
        self._id = f"vm-{uuid.uuid4().hex[:12]}"
        self._command_timeout = command_timeout

    @property
    def id(self) -> str:
        return self._id

    @property
    def sandbox(self) -> Sandbox:
        """The ``vm_sandbox.Sandbox`` the agent works in."""
        return self._sb

    def execute(self, command: str, *, timeout: Optional[int] = None) -> ExecuteResponse:
        """Runs ``command`` with ``/bin/sh -c`` in the VM; stdout then stderr, bounded."""
        limit = timeout if timeout is not None and timeout > 0 else self._command_timeout
        try:
            r = self._sb.exec(command, timeout=limit)
        except VmError as e:
            return ExecuteResponse(output=f"error: the sandbox failed: {e}", exit_code=None)
        output = r.stdout + r.stderr
        truncated = len(output) > MAX_OUTPUT
        text = output[:MAX_OUTPUT].decode("utf-8", "replace")
        if r.timed_out:
            text += f"\n[killed: the command ran past {limit} s]"
        return ExecuteResponse(output=text, exit_code=r.exit_code, truncated=truncated)

    def upload_files(self, files: List[Tuple[str, bytes]]) -> List[FileUploadResponse]:
        out = []
        for path, content in files:
            if not path.startswith("/") or "\0" in path:
                out.append(FileUploadResponse(path=path, error="invalid_path"))
                continue
            try:
                r = self._sb.exec(["sh", "-c", _UPLOAD, "sh", path], stdin=bytes(content))
            except VmError:
                out.append(FileUploadResponse(path=path, error="permission_denied"))
                continue
            out.append(FileUploadResponse(path=path, error=None if r.ok else "permission_denied"))
        return out

    def download_files(self, paths: List[str]) -> List[FileDownloadResponse]:
        out = []
        for path in paths:
            if not path.startswith("/") or "\0" in path:
                out.append(FileDownloadResponse(path=path, error="invalid_path"))
                continue
            try:
                r = self._sb.exec(["sh", "-c", _DOWNLOAD, "sh", path])
            except VmError:
                out.append(FileDownloadResponse(path=path, error="permission_denied"))
                continue
            error = {0: None, 2: "file_not_found", 3: "is_directory"}.get(r.exit_code, "permission_denied")
            out.append(FileDownloadResponse(path=path, content=r.stdout if error is None else None, error=error))
        return out

    def close(self) -> None:
        """Powers the VM off (a ``sandbox=`` given by the caller is left running). Idempotent."""
        if self._owned:
            self._sb.close()

    def __enter__(self) -> "VmSandboxBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
