"""``Sandbox``: one microVM, booted by vm-sandbox from a spec that vm-spec validated."""

import os
import shlex
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from ._errors import CommandFailed, VmError, WallExpired

Argv = Union[str, Sequence[str]]
#: How long one wait for a guest event lasts before Python gets control back (signals).
_TICK = 0.2
#: ``exec``'s default cap on captured output, stdout and stderr together: the Rust client's
#: (``MAX_EXEC_OUTPUT``, 16 MiB). Past it the rest is read and dropped, ``truncated`` is set.
MAX_OUTPUT = 16 * 1024 * 1024


@dataclass(frozen=True)
class ExecResult:
    """A finished command. ``exit_code`` is ``vm exec``'s: the command's code, 128+N for
    signal N, 124 when its ``timeout`` killed it, 127/126 when it was not found / cannot be
    executed (``stderr`` then says why). ``truncated``: the command wrote more than
    ``exec``'s ``max_output``; ``stdout`` and ``stderr`` hold what came first, up to it."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: Optional[int] = None
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self, argv: Argv = ()) -> "ExecResult":
        """Raise ``CommandFailed`` unless the exit code is 0; else return self."""
        if self.exit_code != 0:
            what = argv if isinstance(argv, str) else shlex.join(list(argv))
            tail = self.stderr[-400:].decode("utf-8", "replace").strip()
            raise CommandFailed(
                f"command {what!r} exited {self.exit_code}" + (f": {tail}" if tail else ""),
                None,
                self,
            )
        return self


@dataclass(frozen=True)
class StreamEvent:
    """One event of ``exec_stream``: ``kind`` is ``"stdout"`` or ``"stderr"`` (``data``
    holds the chunk as it arrived) or ``"exit"`` (always last; ``exit_code`` as in
    ``ExecResult``)."""

    kind: str
    data: bytes = b""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False


def _exit_code(code: Optional[int], signal: Optional[int], timed_out: bool) -> int:
    if timed_out:
        return 124
    if signal:
        return 128 + signal
    return code if code is not None else -1


def _argv(argv: Argv) -> List[str]:
    if isinstance(argv, str):
        return ["/bin/sh", "-c", argv]
    return [str(a) for a in argv]


def _size(value: Union[int, str, None], field: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise _refused(field, f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    return _native.parse_mem_mib(field, str(value))


def _seconds(value: Union[int, float, str, None], field: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return _native.parse_duration(field, str(value))


def _refused(field: str, why: str) -> VmError:
    from ._errors import SpecRefused

    return SpecRefused(f"{field}: {why}", field)


def _pairs(value: Union[Mapping[str, str], Iterable[Tuple[str, str]], None]) -> List[Tuple[str, str]]:
    if value is None:
        return []
    items = value.items() if isinstance(value, Mapping) else value
    return [(str(k), str(v)) for k, v in items]


class _Capture:
    """What ``exec`` keeps of a command's output: at most ``max_output`` bytes of stdout and
    stderr together, in arrival order; the rest is dropped (the command runs on, its output
    read, so it is never blocked by a full pipe) and ``truncated`` set."""

    def __init__(self, max_output: int) -> None:
        if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 0:
            raise _refused("max_output", f"{max_output!r} is not a byte count (an int >= 0)")
        self.room = max_output
        self.truncated = False
        self.out: List[bytes] = []
        self.err: List[bytes] = []

    def add(self, ev: "StreamEvent") -> Optional[ExecResult]:
        """Takes one event; the result once it is the exit."""
        if ev.kind == "exit":
            code = ev.exit_code if ev.exit_code is not None else -1
            out, err = b"".join(self.out), b"".join(self.err)
            self.out, self.err = [], []
            return ExecResult(code, out, err, ev.signal, ev.timed_out, self.truncated)
        data = ev.data
        if len(data) > self.room:
            self.truncated = True
            data = data[: self.room]
        if data:
            self.room -= len(data)
            (self.out if ev.kind == "stdout" else self.err).append(data)
        return None


class Stream:
    """The events of a running command; iterate it. Leaving the iteration early (``break``,
    an exception, Ctrl-C) kills the command's whole process tree in the guest."""

    def __init__(self, native: "_native.Stream") -> None:
        self._native = native
        self._done = False

    def __iter__(self) -> Iterator[StreamEvent]:
        try:
            while True:
                kind, payload = self._native.next(_TICK)
                if kind == "wait":
                    continue
                if kind == "end":
                    self._done = True
                    return
                if kind == "exit":
                    code, sig, timed_out = payload
                    self._done = True
                    yield StreamEvent("exit", b"", _exit_code(code, sig, timed_out), sig, timed_out)
                    return
                yield StreamEvent(kind, payload)
        finally:
            if not self._done:
                self.cancel()

    def cancel(self) -> None:
        """Kill the command's process tree (idempotent)."""
        self._done = True
        self._native.cancel()


class Files:
    """File operations confined to the sandbox's root (``/work``): paths are relative to it,
    or absolute under it; ``..`` and any path outside are refused (``PathRefused``)."""

    def __init__(self, vm: "_native.Vm") -> None:
        self._vm = vm

    def write(self, path: str, data: Union[bytes, bytearray, memoryview, str]) -> None:
        """Write ``data`` (held in memory; ``upload`` streams) to ``path``, parents created."""
        if isinstance(data, str):
            data = data.encode()
        self._vm.write_file(path, bytes(data))

    def read(self, path: str) -> bytes:
        """The bytes of ``path`` (at most 64 MiB; ``download`` streams any size)."""
        return self._vm.read_file(path)

    def remove(self, path: str) -> None:
        """Remove the file at ``path`` (a symlink itself, never what it points to); a
        directory, or nothing there, raises ``GuestError``."""
        self._vm.remove_file(path)

    def list(self, dir: str = "") -> List[str]:
        """Regular files under ``dir`` (recursively), sorted, relative to the root."""
        return self._vm.list_files(dir)

    def upload(self, src: Union[str, "os.PathLike[str]"], path: str, max_size: int = 1 << 30) -> int:
        """Stream the host file ``src`` to ``path``; returns the bytes copied."""
        return self._vm.upload(os.fspath(src), path, max_size)

    def download(self, path: str, dst: Union[str, "os.PathLike[str]"], max_size: int = 1 << 30) -> int:
        """Stream ``path`` to the host file ``dst``; returns the bytes copied."""
        return self._vm.download(path, os.fspath(dst), max_size)


class Server:
    """A served process (``Sandbox.serve``): ``url`` (the first port's), ``urls``, ``stop()``;
    a context manager."""

    def __init__(self, native: "_native.Server") -> None:
        self._native = native

    @property
    def url(self) -> str:
        return self._native.urls[0]

    @property
    def urls(self) -> List[str]:
        return list(self._native.urls)

    @property
    def ports(self) -> List[int]:
        return list(self._native.host_ports)

    @property
    def running(self) -> bool:
        return self._native.running

    def output(self) -> str:
        """The tail of the server's combined output."""
        return self._native.output()

    def stop(self) -> None:
        """Stop the process and close its ports (idempotent)."""
        self._native.stop()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Sandbox:
    """A microVM for untrusted work, as ``vm exec``/``vm run`` make it.

    Every argument is the CLI flag of the same name and takes the same values, and the
    same spec is built and validated (vm-spec) before anything boots: ``memory`` ("512M",
    or an int in MiB), ``cpus``, ``pids``, ``timeout`` (the VM's wall lifetime: "10m", or
    seconds), ``mounts`` ({host: guest}, always read-only: ``"guest:rw"`` is refused),
    ``env`` (exactly these variables over the image's; secret-looking names are refused
    unless listed in ``env_allow``), ``image`` (an OCI reference, pulled when missing),
    ``rootfs``, ``user``, ``trust`` and ``allow_emulation`` (accept QEMU emulation — a
    weaker boundary — on a host without hardware virtualization). ``snapshots`` (a
    directory) allows ``snapshot()``, which saves the VM for ``Sandbox.restore`` (kvm only: on
    another driver the sandbox is refused with the reason). ``dax_window`` ("256M", or MiB;
    0 for none) sizes each mount's DAX window on kvm and is refused where there is none
    (tcg), as ``--dax-window`` is. A refusal raises
    ``SpecRefused`` naming the field; nothing has booted then.

    >>> with Sandbox(memory="256M", allow_emulation=True) as sb:   # doctest: +SKIP
    ...     sb.exec(["sh", "-c", "echo $((6*7))"]).stdout
    b'42\\n'
    """

    def __init__(
        self,
        image: Optional[str] = None,
        *,
        memory: Union[int, str, None] = None,
        cpus: Optional[int] = None,
        pids: Optional[int] = None,
        timeout: Union[int, float, str, None] = None,
        mounts: Union[Mapping[str, str], Iterable[Tuple[str, str]], None] = None,
        env: Union[Mapping[str, str], Iterable[Tuple[str, str]], None] = None,
        env_allow: Sequence[str] = (),
        allow_mount_secret: Sequence[str] = (),
        rootfs: Optional[str] = None,
        kernel: Optional[str] = None,
        initrd: Optional[str] = None,
        user: Optional[str] = None,
        workdir: Optional[str] = None,
        trust: str = "untrusted",
        allow_emulation: bool = False,
        allow_weaker_jail: bool = False,
        driver: Optional[str] = None,
        name: Optional[str] = None,
        run_dir: Optional[str] = None,
        boot_timeout: Union[int, float, str] = 300,
        snapshots: Optional[str] = None,
        dax_window: Union[int, str, None] = None,
    ) -> None:
        self._vm = _native.boot(
            memory_mib=_size(memory, "memory"),
            cpus=cpus,
            pids=pids,
            timeout=_seconds(timeout, "timeout"),
            mounts=_pairs(mounts),
            env=_pairs(env),
            env_allow=list(env_allow),
            mount_secret_allow=[os.fspath(p) for p in allow_mount_secret],
            kernel=kernel,
            initrd=initrd,
            rootfs=rootfs,
            image=image,
            user=user,
            trust=trust,
            allow_emulation=allow_emulation,
            allow_weaker_jail=allow_weaker_jail,
            driver=driver,
            name=name,
            run_dir=run_dir,
            boot_timeout=_seconds(boot_timeout, "boot_timeout"),
            snapshots=None if snapshots is None else os.fspath(snapshots),
            dax_window_mib=_size(dax_window, "dax_window"),
        )
        self._workdir = workdir
        self.files = Files(self._vm)

    @classmethod
    def attach(cls, name: str) -> "Sandbox":
        """The running VM that ``vm run -d --name NAME`` started, attached by its record (the
        CLI's runtime state directory: ``$VM_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/vm``, …).

        The same object API as a booted sandbox — ``exec``, ``exec_stream``, ``files``,
        ``serve``, ``pause``/``resume`` (through the VM's holder, as ``vm pause``) — with the
        environment, user and working directory the VM was started with. It does not own the
        VM: ``close()`` (or leaving the ``with`` block) only detaches, and the VM keeps running
        until ``vm stop``/``vm rm -f`` or its wall lifetime. Raises ``NoSuchVm`` for an unknown
        name, ``Paused``/``NotRunning`` for a VM that is not running; a guest call after
        another command paused or stopped the VM raises the same at once.

        >>> with Sandbox.attach("box") as sb:   # doctest: +SKIP
        ...     sb.exec(["uname", "-r"]).stdout
        """
        sb = cls.__new__(cls)
        sb._vm = _native.attach(name)
        sb._workdir = sb._vm.workdir
        sb.files = Files(sb._vm)
        return sb

    @classmethod
    def restore(
        cls,
        path: Union[str, "os.PathLike[str]"],
        *,
        workdir: Optional[str] = None,
        trust: str = "untrusted",
        allow_emulation: bool = False,
        allow_weaker_jail: bool = False,
        driver: Optional[str] = None,
        name: Optional[str] = None,
        run_dir: Optional[str] = None,
        boot_timeout: Union[int, float, str] = 300,
    ) -> "Sandbox":
        """A new VM restored from the snapshot directory ``path`` (``Sandbox.snapshot`` or
        ``vm snapshot create`` wrote it; ``vm snapshot ls`` lists the CLI's under
        ``~/.cache/vm/snapshots``), instead of booting one.

        Its memory, mounts, environment and image are the snapshot's: only the admission is
        given here (``trust``, ``allow_emulation``, ``driver``: a restore passes the same gate
        as a boot). Each mounted file must be unchanged since the snapshot, or ``VmError``
        names the mount. The VM has its own run directory and agent token; restoring one
        snapshot twice gives two VMs that share no writable state. Snapshots need the kvm
        driver.

        >>> with Sandbox.restore(os.path.expanduser("~/.cache/vm/snapshots/py")) as sb:   # doctest: +SKIP
        ...     sb.exec(["python3", "-c", "import numpy"]).check()
        """
        sb = cls.__new__(cls)
        sb._vm = _native.restore(
            os.fspath(path),
            trust=trust,
            allow_emulation=allow_emulation,
            allow_weaker_jail=allow_weaker_jail,
            driver=driver,
            name=name,
            run_dir=run_dir,
            boot_timeout=_seconds(boot_timeout, "boot_timeout"),
        )
        sb._workdir = workdir
        sb.files = Files(sb._vm)
        return sb

    def snapshot(self, path: Union[str, "os.PathLike[str]"]) -> Dict[str, object]:
        """Saves this VM into the new directory ``path`` and ends it; ``Sandbox.restore(path)``
        makes new VMs from it. The sandbox must have been made with ``snapshots=DIR`` (the
        directory ``path`` is on: its filesystem holds the memory file while it is written),
        and the driver must take snapshots (kvm; on tcg ``Sandbox(snapshots=...)`` is already
        refused, with QEMU's reason). Returns what was written: ``driver``,
        ``memory_bytes``, ``memory_written``, ``state_bytes``, ``took_us``.
        """
        record = self._vm.snapshot(os.fspath(path))
        self.close()
        return record

    # -- commands ---------------------------------------------------------------------------

    def exec_stream(
        self,
        argv: Argv,
        *,
        stdin: Optional[bytes] = None,
        timeout: Union[int, float, str, None] = None,
        cwd: Optional[str] = None,
        env: Union[Mapping[str, str], Iterable[Tuple[str, str]], None] = None,
        env_allow: Sequence[str] = (),
        user: Optional[str] = None,
    ) -> Stream:
        """Start ``argv`` (a list; a string runs under ``/bin/sh -c``) and stream its output:
        iterate the result for ``StreamEvent``s as chunks arrive, then its exit."""
        native = self._guest_call(
            self._vm.exec_stream,
            _argv(argv),
            stdin=None if stdin is None else bytes(stdin),
            cwd=cwd if cwd is not None else self._workdir,
            timeout=_seconds(timeout, "timeout"),
            env=_pairs(env),
            env_allow=list(env_allow),
            user=user,
        )
        return Stream(native)

    def exec(
        self,
        argv: Argv,
        *,
        check: bool = False,
        stdin: Optional[bytes] = None,
        timeout: Union[int, float, str, None] = None,
        cwd: Optional[str] = None,
        env: Union[Mapping[str, str], Iterable[Tuple[str, str]], None] = None,
        env_allow: Sequence[str] = (),
        user: Optional[str] = None,
        max_output: int = MAX_OUTPUT,
    ) -> ExecResult:
        """Run ``argv`` to its end: ``ExecResult(exit_code, stdout, stderr)``. A non-zero
        exit is a result; ``check=True`` raises ``CommandFailed`` instead. ``timeout`` kills
        the command's process tree (exit 124). Ctrl-C kills it too, then raises
        ``KeyboardInterrupt``. At most ``max_output`` bytes of output are kept (stdout and
        stderr together, 16 MiB by default): past it the rest is dropped and the result's
        ``truncated`` is set; ``exec_stream`` hands over output of any size as it comes."""
        capture = _Capture(max_output)
        stream = self.exec_stream(
            argv, stdin=stdin, timeout=timeout, cwd=cwd, env=env, env_allow=env_allow, user=user
        )
        result = None
        try:
            for ev in stream:
                result = capture.add(ev) or result
        except VmError as e:
            self._raise_expired(e)
            raise
        if result is None:
            raise VmError("the guest closed the command's stream without an exit status")
        return result.check(argv) if check else result

    def _guest_call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except VmError as e:
            self._raise_expired(e)
            raise

    def _raise_expired(self, e: VmError) -> None:
        if not isinstance(e, WallExpired) and self._vm.wall_expired():
            raise WallExpired(f"the VM's wall lifetime expired: {e}") from e

    # -- serving, lifetime ------------------------------------------------------------------

    def serve(
        self,
        argv: Argv = (),
        ports: Sequence[str] = ("0:8080",),
        ready: Optional[str] = None,
        ready_timeout: Union[int, float, str] = 300,
    ) -> Server:
        """Start a long-lived process (empty ``argv``: the image's Entrypoint + Cmd) with
        ``ports`` published on host loopback (``"0:8080"``: a free port to guest 8080;
        ``"8000"``, ``"9000-9001:9000-9001"`` as ``vm serve -p``) and wait until every port
        accepts connections and, with ``ready``, ``GET ready`` answers 2xx. ``.url`` is
        ``http://127.0.0.1:PORT``."""
        secs = _seconds(ready_timeout, "ready_timeout")
        return Server(
            self._guest_call(self._vm.serve, [] if argv == () else _argv(argv), list(ports), ready, secs)
        )

    def pause(self) -> None:
        """Freeze every host process of the VM (guest calls raise ``Paused`` meanwhile)."""
        self._vm.pause()

    def resume(self) -> None:
        """Thaw a paused VM."""
        self._vm.resume()

    def close(self) -> None:
        """Power the guest off, kill what is left, remove its run directory. An attached
        sandbox (``Sandbox.attach``) only detaches: the VM keeps running. Idempotent."""
        self._vm.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- facts ------------------------------------------------------------------------------

    @property
    def name(self) -> Optional[str]:
        """The VM's name when attached (``Sandbox.attach``), else None."""
        return self._vm.name

    @property
    def attached(self) -> bool:
        """True for a sandbox attached to a named VM (closing it does not stop the VM)."""
        return self._vm.name is not None

    @property
    def driver(self) -> str:
        """The driver that booted it (``kvm``, ``tcg``)."""
        return self._vm.driver

    @property
    def containment(self) -> str:
        """``microVM`` (kvm) or ``user-kernel`` (emulation)."""
        return self._vm.containment

    @property
    def generation(self) -> Optional[int]:
        """How many restores lie behind this sandbox: 0 when booted, 1 when restored from a
        snapshot of a booted one, and so on (``None`` for an attached VM). The guest reads the
        same number in ``/run/vm/generation``, written once its kernel's CRNG was reseeded with
        this host's entropy: a guest process that seeded a generator before the snapshot must
        seed it again when the number changes (docs/usage.md)."""
        return self._vm.generation

    @property
    def root(self) -> str:
        """The guest working root (``/work``)."""
        return self._vm.root

    @property
    def run_dir(self) -> str:
        """The host directory holding the VM's sockets (removed by ``close``); for an attached
        VM, its state directory (kept)."""
        return os.fspath(self._vm.run_dir)

    def host_pids(self) -> List[int]:
        """The VM's host processes (empty once it is closed)."""
        return list(self._vm.host_pids())


@dataclass(frozen=True)
class VmInfo:
    """One named VM as ``vm ps`` shows it (``vm_sandbox.ps()``). ``state`` is ``starting``,
    ``running``, ``paused``, ``stopping`` or ``exited``; ``uptime`` is in seconds (None before
    the VM answered); ``host_pids`` are its live host processes; ``exit_reason`` says why it
    exited."""

    name: str
    state: str
    driver: Optional[str]
    containment: Optional[str]
    uptime: Optional[int]
    memory_mib: int
    cpus: int
    created: int
    exit_reason: Optional[str]
    supervisor_pid: Optional[int]
    host_pids: List[int]
    labels: Dict[str, str]


def ps() -> List[VmInfo]:
    """The named VMs (``vm run -d --name NAME``), sorted by name, as ``vm ps`` lists them
    (a VM whose holder is gone is shown ``exited`` and cleaned, as ``vm ps`` does).

    >>> [(v.name, v.state) for v in ps()]   # doctest: +SKIP
    [('box', 'running')]
    """
    return [
        VmInfo(
            name=d["name"],
            state=d["state"],
            driver=d["driver"],
            containment=d["containment"],
            uptime=d["uptime_s"],
            memory_mib=d["mem_mib"],
            cpus=d["vcpus"],
            created=d["created_unix"],
            exit_reason=d["exit_reason"],
            supervisor_pid=d["supervisor_pid"],
            host_pids=list(d["host_pids"]),
            labels=dict(d["labels"]),
        )
        for d in _native.ps()
    ]


def drivers() -> List[Dict[str, object]]:
    """The driver registry with each driver's verdict here, in preference order: dicts with
    ``name``, ``available``, ``containment``, ``jail``, ``reason``."""
    return _native.drivers()
