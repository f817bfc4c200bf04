"""A sandbox client for the OpenAI Agents SDK (``agents.sandbox``): every sandbox session is one
``vm`` microVM (no network device, read-only mounts, capped memory and lifetime).

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from vm_sandbox.integrations.openai_agents import VmSandboxClient, VmSandboxClientOptions

    agent = SandboxAgent(name="coder", instructions="...")
    config = RunConfig(sandbox=SandboxRunConfig(
        client=VmSandboxClient(), options=VmSandboxClientOptions(allow_emulation=True)))
    result = await Runner.run(agent, "write hello.py and run it", run_config=config)

The SDK's shell tool runs its commands with ``sh -lc`` in the VM, its file tools read and write
through it, and when the run ends the session is shut down: the VM is powered off and gone.
A session resumed from saved state gets a fresh VM with its workspace restored from the SDK's
snapshot (a tar of the workspace). Commands run as the image's user (``run_as`` users are not
provisioned: the VM is the boundary), and guest ports are not exposed to the SDK.

Tested with ``openai-agents`` in :data:`TESTED_WITH` (the ``openai-agents`` extra's range).
"""

from __future__ import annotations

import asyncio
import io
import uuid
from pathlib import Path
from typing import Dict, Literal, Optional, Sequence, Union

try:
    from agents.sandbox import Manifest
    from agents.sandbox.errors import (
        ExecTimeoutError,
        ExecTransportError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
        WorkspaceStartError,
    )
    from agents.sandbox.session import (
        BaseSandboxClient,
        BaseSandboxClientOptions,
        BaseSandboxSession,
        SandboxSession,
        SandboxSessionState,
    )
    from agents.sandbox.session.manager import Instrumentation
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, User
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "vm_sandbox.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'vm-sandbox[openai-agents]'"
    ) from e

from .. import AsyncSandbox, VmError

#: The framework range this client was tested with (the ``openai-agents`` extra's).
TESTED_WITH = "openai-agents>=0.24,<0.25"

_Amount = Union[int, str, None]


class VmSandboxClientOptions(BaseSandboxClientOptions):
    """How each session's VM is made: ``vm_sandbox.Sandbox``'s arguments of the same names
    (``image``: an OCI reference; ``memory``: "512M" or MiB; ``timeout``: the VM's whole
    lifetime, "30m" or seconds; ``mounts``: {host path: guest path}, always read-only;
    ``env``: the guest environment; ``allow_emulation``: accept QEMU emulation on a host
    without hardware virtualization). A refused value raises ``vm_sandbox.SpecRefused``
    naming it when the session starts, before anything boots."""

    type: Literal["vm"] = "vm"
    image: Optional[str] = None
    rootfs: Optional[str] = None
    memory: _Amount = "512M"
    cpus: Optional[int] = None
    timeout: _Amount = "30m"
    mounts: Dict[str, str] = {}
    env: Dict[str, str] = {}
    trust: str = "untrusted"
    allow_emulation: bool = False
    driver: Optional[str] = None


class VmSandboxSessionState(SandboxSessionState):
    """A session's serializable state: the SDK's, plus how its VM is made."""

    type: Literal["vm"] = "vm"
    vm: VmSandboxClientOptions = VmSandboxClientOptions()


class VmSandboxSession(BaseSandboxSession):
    """One session: one microVM, booted when the session starts, powered off at shutdown."""

    state: VmSandboxSessionState

    def __init__(self, *, state: VmSandboxSessionState) -> None:
        self.state = state
        self._sb: Optional[AsyncSandbox] = None
        self._boot_lock = asyncio.Lock()
        self._root_made = False

    # -- the VM -------------------------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        async with self._boot_lock:
            if self._sb is not None:
                return
            o = self.state.vm
            self._sb = await AsyncSandbox.create(
                image=o.image,
                rootfs=o.rootfs,
                memory=o.memory,
                cpus=o.cpus,
                timeout=o.timeout,
                mounts=dict(o.mounts),
                env=dict(o.env),
                trust=o.trust,
                allow_emulation=o.allow_emulation,
                driver=o.driver,
            )

    async def _prepare_backend_workspace(self) -> None:
        root = str(self.state.manifest.root)
        result = await self._run(["mkdir", "-p", "--", root], cwd=None)
        if not result.ok:
            raise WorkspaceStartError(
                path=Path(root),
                context={"stderr": result.stderr.decode("utf-8", "replace")[-2000:]},
                message=f"failed to start session: mkdir {root} in the VM exited {result.exit_code}",
            )
        self._root_made = True

    async def running(self) -> bool:
        return self._sb is not None and bool(self._sb.sync.host_pids())

    async def _shutdown_backend(self) -> None:
        sb, self._sb = self._sb, None
        if sb is not None:
            await sb.close()

    def _require(self) -> AsyncSandbox:
        if self._sb is None:
            raise ExecTransportError(command=("<vm>",), message="the session's VM is not running")
        return self._sb

    async def _run(self, argv: Sequence[str], *, cwd: Optional[str], stdin: Optional[bytes] = None, timeout=None):
        return await self._require().exec(list(argv), cwd=cwd, stdin=stdin, timeout=timeout)

    # -- commands -----------------------------------------------------------------------

    def _prepare_exec_command(self, *command, shell, user):
        if user:
            raise ValueError(
                "a vm sandbox session runs commands as the image's user: run_as users are not supported"
            )
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _exec_internal(self, *command: Union[str, Path], timeout: Optional[float] = None) -> ExecResult:
        argv = [str(c) for c in command]
        cwd = str(self.state.manifest.root) if self._root_made else None
        try:
            r = await self._run(argv, cwd=cwd, timeout=timeout if timeout and timeout > 0 else None)
        except VmError as e:
            raise ExecTransportError(command=argv, cause=e) from e
        if r.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(stdout=r.stdout, stderr=r.stderr, exit_code=r.exit_code)

    # -- files --------------------------------------------------------------------------

    async def read(self, path: Union[Path, str], *, user: Union[str, User, None] = None) -> io.IOBase:
        target = await self._validate_path_access(path)
        r = await self._exec_internal("cat", "--", str(target))
        if r.exit_code != 0:
            exists = await self._exec_internal("test", "-e", str(target))
            if exists.exit_code != 0:
                raise WorkspaceReadNotFoundError(path=Path(str(target)))
            raise WorkspaceArchiveReadError(
                path=Path(str(target)), context={"stderr": r.stderr.decode("utf-8", "replace")[-2000:]}
            )
        return io.BytesIO(r.stdout)

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        target = await self._validate_path_access(path)
        r = await self._exec_internal("head", "-c", str(max_bytes), "--", str(target))
        if r.exit_code != 0:
            raise WorkspaceReadNotFoundError(path=Path(str(target)))
        return r.stdout[:max_bytes]

    async def write(
        self, path: Union[Path, str], data: io.IOBase, *, user: Union[str, User, None] = None
    ) -> None:
        target = await self._validate_path_access(path, for_write=True)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        try:
            r = await self._run(["sh", "-c", script, "sh", str(target)], cwd=None, stdin=bytes(payload))
        except VmError as e:
            raise WorkspaceArchiveWriteError(path=Path(str(target)), cause=e) from e
        if not r.ok:
            raise WorkspaceArchiveWriteError(
                path=Path(str(target)), context={"stderr": r.stderr.decode("utf-8", "replace")[-2000:]}
            )

    async def persist_workspace(self) -> io.IOBase:
        root = str(self.state.manifest.root)
        r = await self._exec_internal("tar", "-C", root, "-cf", "-", ".")
        if r.exit_code != 0:
            raise WorkspaceArchiveReadError(
                path=Path(root), context={"stderr": r.stderr.decode("utf-8", "replace")[-2000:]}
            )
        return io.BytesIO(r.stdout)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = str(self.state.manifest.root)
        payload = data.read()
        r = await self._run(["tar", "-C", root, "-xf", "-"], cwd=None, stdin=bytes(payload))
        if not r.ok:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"stderr": r.stderr.decode("utf-8", "replace")[-2000:]}
            )


class VmSandboxClient(BaseSandboxClient[Optional[VmSandboxClientOptions]]):
    """Creates sessions whose sandbox is a ``vm`` microVM (see the module docs)."""

    backend_id = "vm"
    supports_default_options = True

    def __init__(self, *, instrumentation: Optional[Instrumentation] = None, dependencies=None) -> None:
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    async def create(
        self,
        *,
        snapshot: Union[SnapshotSpec, SnapshotBase, None] = None,
        manifest: Optional[Manifest] = None,
        options: Optional[VmSandboxClientOptions] = None,
    ) -> SandboxSession:
        manifest = self._validate_manifest_for_create(manifest if manifest is not None else Manifest())
        session_id = uuid.uuid4()
        state = VmSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            vm=options if options is not None else VmSandboxClientOptions(),
        )
        return self._wrap_session(VmSandboxSession(state=state), instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Powers the session's VM off (idempotent: shutdown usually did already)."""
        inner = session._inner
        if not isinstance(inner, VmSandboxSession):
            raise TypeError("VmSandboxClient.delete expects a session it created")
        await inner._shutdown_backend()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A fresh VM for saved state; its workspace is restored from the state's snapshot."""
        if not isinstance(state, VmSandboxSessionState):
            raise TypeError("VmSandboxClient.resume expects a VmSandboxSessionState")
        return self._wrap_session(VmSandboxSession(state=state), instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: Dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, VmSandboxSessionState)
