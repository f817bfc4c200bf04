"""Output of any size costs the Python process bounded memory (issue 39). ``exec`` once kept
every chunk in Python lists: a guest ``head -c 300000000 /dev/zero`` grew the process by
580 MB and ``yes`` grew it until the timeout. Now ``exec`` keeps at most ``max_output`` bytes
(16 MiB by default, the Rust client's cap) and sets ``truncated``; ``exec_stream`` is
back-pressured: a consumer that stops reading stops the guest command, nothing piles up.

Peak memory is the kernel's own high-water mark (``VmHWM``), reset before each measurement
through ``/proc/self/clear_refs``, so a short peak between two samples is not missed."""

import time

import pytest

import vm_sandbox
from vm_sandbox import SpecRefused

MIB = 1024 * 1024
#: How far above its baseline the Python process may go while a guest floods it.
BOUND = 64 * MIB
#: Long enough for `yes` to write far more than BOUND through an unbounded `exec` on tcg.
FLOOD_SECONDS = 20
#: What `yes` repeats: 1 KiB lines (1023 bytes and the newline) make it write in large chunks,
#: so the flood is bounded by the exec stream, not by the emulated guest's `yes` (measured
#: 2026-12-04, tcg, load 14: 10 MiB/s through `exec_stream` for 64 KiB chunks, 1.7 MiB/s for
#: `yes`' 2-byte lines).
LINE = b"y" * 1023


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Resets the peak RSS to the current RSS; returns the current RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def _peak() -> int:
    return _status_kib("VmHWM") * 1024


def test_exec_of_yes_keeps_the_process_within_64_mib(sb):
    base = _reset_peak()
    r = sb.exec(["yes", LINE.decode()], timeout=FLOOD_SECONDS)
    grew = _peak() - base
    print(f"exec yes for {FLOOD_SECONDS}s: peak RSS {grew / MIB:.1f} MiB above the baseline")
    assert grew < BOUND, f"the process grew by {grew / MIB:.1f} MiB (bound {BOUND / MIB:.0f})"
    assert r.timed_out and r.exit_code == 124, r.exit_code
    assert r.truncated, "yes wrote more than the cap"
    assert len(r.stdout) == vm_sandbox.MAX_OUTPUT == 16 * MIB
    assert r.stdout == (LINE + b"\n") * (16 * 1024), "the first 16 MiB, exactly"


def test_max_output_is_the_callers_and_counts_both_streams(sb):
    # 600 bytes on each stream, a cap of 1000: counted together, 1000 come back whichever pipe
    # the agent drains first (no order holds between two pipes: a CI run saw stderr drained
    # first); counted apart, all 1200 would.
    r = sb.exec(["sh", "-c", "head -c 600 /dev/zero; head -c 600 /dev/zero >&2"], max_output=1000)
    assert r.exit_code == 0 and r.truncated, r
    assert len(r.stdout) + len(r.stderr) == 1000, (len(r.stdout), len(r.stderr))
    assert 400 <= len(r.stdout) <= 600 and 400 <= len(r.stderr) <= 600, r
    r = sb.exec(["sh", "-c", "echo fits"], max_output=5)
    assert (r.stdout, r.truncated) == (b"fits\n", False)
    r = sb.exec(["sh", "-c", "echo fitx"], max_output=4)
    assert (r.stdout, r.truncated) == (b"fitx", True)
    for bad in (-1, 1.5, True, "16M"):
        with pytest.raises(SpecRefused) as e:
            sb.exec(["true"], max_output=bad)
        assert "max_output" in str(e.value)


def _cpu_ticks(sb, comm: str) -> int:
    """The guest CPU time (ticks) of the one process named `comm`."""
    script = (
        f'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = {comm} ] && cat $p/stat; '
        "done; true"
    )
    lines = sb.exec(["sh", "-c", script], check=True).stdout.decode().splitlines()
    assert len(lines) == 1, f"{len(lines)} processes named {comm}: {lines}"
    fields = lines[0].rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_a_stream_nobody_reads_stops_the_guest_command(sb):
    base = _reset_peak()
    stream = iter(sb.exec_stream(["yes"], timeout=120))
    try:
        first = next(stream)
        assert first.kind == "stdout" and first.data.startswith(b"y\n")
        # Nobody reads: once the buffers on the way are full, `yes` blocks in its write.
        time.sleep(3)
        before = _cpu_ticks(sb, "yes")
        time.sleep(2)
        after = _cpu_ticks(sb, "yes")
        assert after == before, f"yes ran on while nobody read ({before} -> {after} ticks)"
        grew = _peak() - base
        assert grew < BOUND, f"the process grew by {grew / MIB:.1f} MiB with nothing read"
        # Reading again lets it run again.
        got = 0
        for ev in stream:
            got += len(ev.data)
            if got > 8 * MIB:
                break
        assert _cpu_ticks(sb, "yes") > after, "yes did not run again once read"
    finally:
        stream.close()
    time.sleep(0.5)
    assert b"yes" not in sb.exec(["ps"]).stdout
