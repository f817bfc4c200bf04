"""``AsyncSandbox``: the asyncio flavour of ``Sandbox``, over the same objects.

A thread bridge: each blocking call runs on a worker thread (the calls release the GIL, and
all of them share the extension's one Tokio runtime), so many sandboxes boot and run side
by side under ``asyncio.gather``. Cancelling a task that awaits ``exec`` (Ctrl-C under
``asyncio.run``) kills the guest command's process tree.
"""

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, List, Optional

from ._sandbox import (
    MAX_OUTPUT,
    ExecResult,
    Files,
    Sandbox,
    Server,
    StreamEvent,
    _Capture,
    _exit_code,
    _TICK,
)

_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="vm-sandbox")


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))


class AsyncFiles:
    """``Files`` with awaitable calls."""

    def __init__(self, files: Files) -> None:
        self._files = files

    async def write(self, path: str, data: bytes) -> None:
        await _call(self._files.write, path, data)

    async def read(self, path: str) -> bytes:
        return await _call(self._files.read, path)

    async def list(self, dir: str = "") -> List[str]:
        return await _call(self._files.list, dir)

    async def remove(self, path: str) -> None:
        await _call(self._files.remove, path)

    async def upload(self, src: str, path: str, max_size: int = 1 << 30) -> int:
        return await _call(self._files.upload, src, path, max_size)

    async def download(self, path: str, dst: str, max_size: int = 1 << 30) -> int:
        return await _call(self._files.download, path, dst, max_size)


class AsyncSandbox:
    """``async with AsyncSandbox(...) as sb: r = await sb.exec([...])``. Takes ``Sandbox``'s
    arguments; it boots in ``__aenter__`` (or ``await AsyncSandbox.create(...)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args
        self._kwargs = kwargs
        self._sb: Optional[Sandbox] = None

    @classmethod
    async def attach(cls, name: str) -> "AsyncSandbox":
        """``sb = await AsyncSandbox.attach("box")``: as ``Sandbox.attach`` (closing it only
        detaches; the VM keeps running)."""
        sb = cls()
        sb._sb = await _call(Sandbox.attach, name)
        return sb

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> "AsyncSandbox":
        sb = cls(*args, **kwargs)
        await sb._boot()
        return sb

    async def _boot(self) -> None:
        if self._sb is None:
            self._sb = await _call(Sandbox, *self._args, **self._kwargs)

    @property
    def sync(self) -> Sandbox:
        """The underlying ``Sandbox`` (booted)."""
        if self._sb is None:
            raise RuntimeError("AsyncSandbox is not booted: use `async with` or create()")
        return self._sb

    @property
    def files(self) -> AsyncFiles:
        return AsyncFiles(self.sync.files)

    async def __aenter__(self) -> "AsyncSandbox":
        await self._boot()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def exec_stream(self, argv: Any, **kwargs: Any) -> AsyncIterator[StreamEvent]:
        """``async for ev in sb.exec_stream([...])``: as ``Sandbox.exec_stream``."""
        stream = await _call(self.sync.exec_stream, argv, **kwargs)
        native = stream._native
        done = False
        try:
            while True:
                kind, payload = await _call(native.next, _TICK)
                if kind == "wait":
                    continue
                if kind == "end":
                    done = True
                    return
                if kind == "exit":
                    code, sig, timed_out = payload
                    done = True
                    yield StreamEvent("exit", b"", _exit_code(code, sig, timed_out), sig, timed_out)
                    return
                yield StreamEvent(kind, payload)
        finally:
            if not done:
                await _call(native.cancel)

    async def exec(
        self, argv: Any, *, check: bool = False, max_output: int = MAX_OUTPUT, **kwargs: Any
    ) -> ExecResult:
        """As ``Sandbox.exec`` (``max_output`` too); cancelling the awaiting task kills the
        guest command."""
        capture = _Capture(max_output)
        result: Optional[ExecResult] = None
        async for ev in self.exec_stream(argv, **kwargs):
            result = capture.add(ev) or result
        if result is None:
            from ._errors import VmError

            raise VmError("the guest closed the command's stream without an exit status")
        return result.check(argv) if check else result

    async def serve(self, *args: Any, **kwargs: Any) -> Server:
        return await _call(self.sync.serve, *args, **kwargs)

    async def pause(self) -> None:
        await _call(self.sync.pause)

    async def resume(self) -> None:
        await _call(self.sync.resume)

    async def close(self) -> None:
        if self._sb is not None:
            await _call(self._sb.close)
