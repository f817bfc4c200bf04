"""Commands in a real guest: exit codes, output, streaming, timeouts, Ctrl-C."""

import hashlib
import os
import signal
import threading
import time

import pytest

from vm_sandbox import CommandFailed, ExecResult


def test_exit_codes(sb):
    assert sb.exec(["true"]) == ExecResult(0, b"", b"")
    assert sb.exec(["sh", "-c", "exit 7"]).exit_code == 7
    r = sb.exec(["no-such-command-xyz"])
    assert r.exit_code == 127, r
    assert b"no-such-command-xyz" in r.stderr and b"not found" in r.stderr, r.stderr
    sb.files.write("not-executable.sh", b"echo never\n")
    r = sb.exec(["./not-executable.sh"])
    assert r.exit_code == 126, r
    r = sb.exec(["sh", "-c", "kill -9 $$"])
    assert (r.exit_code, r.signal) == (137, 9), r


def test_check_raises_command_failed(sb):
    with pytest.raises(CommandFailed) as e:
        sb.exec(["sh", "-c", "echo boom >&2; exit 3"], check=True)
    assert e.value.result.exit_code == 3
    assert "boom" in str(e.value)
    assert sb.exec(["true"], check=True).ok


def test_stdout_and_stderr_apart(sb):
    r = sb.exec(["sh", "-c", "echo out; echo err >&2; echo out2"])
    assert r.stdout == b"out\nout2\n"
    assert r.stderr == b"err\n"


def test_binary_stdout_of_1_mib_is_exact(sb):
    data = os.urandom(1 << 20)
    sb.files.write("blob.bin", data)
    r = sb.exec(["cat", "blob.bin"])
    assert r.exit_code == 0
    assert len(r.stdout) == len(data)
    assert hashlib.sha256(r.stdout).hexdigest() == hashlib.sha256(data).hexdigest()


def test_stdin_env_cwd_and_shell_string(sb):
    assert sb.exec(["wc", "-c"], stdin=b"x" * 1000).stdout.strip() == b"1000"
    assert sb.exec("echo $MODE", env={"MODE": "eval"}).stdout == b"eval\n"
    sb.files.write("sub/f", b"")
    assert sb.exec(["pwd"], cwd="sub").stdout == b"/work/sub\n"


def test_stream_delivers_the_first_chunk_before_the_end(sb):
    start = time.monotonic()
    events = []
    for ev in sb.exec_stream(["sh", "-c", "echo first; sleep 3; echo second >&2; exit 5"]):
        events.append((time.monotonic() - start, ev))
    kinds = [(ev.kind, ev.data) for _, ev in events]
    assert kinds[0] == ("stdout", b"first\n"), kinds
    assert ("stderr", b"second\n") in kinds
    assert events[-1][1].kind == "exit" and events[-1][1].exit_code == 5
    first_at, end_at = events[0][0], events[-1][0]
    assert end_at - first_at >= 2.5, f"first chunk at {first_at:.2f}s, exit at {end_at:.2f}s"


def test_leaving_a_stream_kills_the_command(sb):
    for ev in sb.exec_stream(["sh", "-c", "echo started; exec sleep 300"]):
        assert ev.data == b"started\n"
        break
    time.sleep(0.5)
    ps = sb.exec(["ps"]).stdout
    assert b"sleep 300" not in ps, ps


def test_command_timeout_kills_it(sb):
    r = sb.exec(["sleep", "30"], timeout=1)
    assert r.timed_out and r.exit_code == 124, r


def test_ctrl_c_cancels_the_guest_command(sb):
    """SIGINT during exec: KeyboardInterrupt in Python, and the guest command tree is gone."""
    assert threading.current_thread() is threading.main_thread()
    # Python raises KeyboardInterrupt only where SIGINT was not ignored when it started (a
    # background job of a non-interactive shell inherits SIG_IGN): Ctrl-C's own handler here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            sb.exec(["sh", "-c", "sleep 120; echo never"])
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30
    time.sleep(0.5)
    ps = sb.exec(["ps"]).stdout
    assert b"sleep 120" not in ps, ps


def test_blocking_calls_release_the_gil(sb):
    """While one thread waits on a guest command, another runs Python freely."""
    done = threading.Event()

    def wait():
        sb.exec(["sleep", "2"])
        done.set()

    t = threading.Thread(target=wait)
    t.start()
    spins, start = 0, time.monotonic()
    while not done.is_set() and time.monotonic() - start < 30:
        spins += 1
    t.join()
    elapsed = time.monotonic() - start
    assert elapsed >= 1.5
    assert spins / elapsed > 500_000, f"{spins} spins in {elapsed:.1f}s: the GIL was held"
