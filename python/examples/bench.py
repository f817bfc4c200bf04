"""SDK vs CLI, measured side by side in one run (the issue's two benchmark rows).

    ~/.cache/vm/venv-sdk/bin/python python/examples/bench.py [--vm PATH] [--warm N] [--cold N]

- warm: ``Sandbox.exec(["true"])`` in a booted sandbox vs ``vm exec NAME -- true`` (a whole
  CLI process) against a ``vm run -d`` VM; medians.
- cold: ``with Sandbox(...) as sb: sb.exec(["true"])`` vs ``vm exec -- true``; medians.
Both on whatever driver the host has (``--allow-emulation``). Prints one JSON document.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import time

from vm_sandbox import Sandbox


def timed(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out), out


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vm", default=shutil.which("vm") or "vm")
    ap.add_argument("--warm", type=int, default=30)
    ap.add_argument("--cold", type=int, default=5)
    a = ap.parse_args()
    name = "sdk-bench"
    subprocess.run([a.vm, "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run([a.vm, "run", "-d", "--name", name, "--allow-emulation"])
    try:
        run([a.vm, "exec", name, "--", "true"])
        cli_warm, _ = timed(lambda: run([a.vm, "exec", name, "--", "true"]), a.warm)
    finally:
        subprocess.run([a.vm, "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with Sandbox(allow_emulation=True) as sb:
        sb.exec(["true"])
        sdk_warm, _ = timed(lambda: sb.exec(["true"], check=True), a.warm)

    def sdk_cold():
        with Sandbox(allow_emulation=True) as sb:
            sb.exec(["true"], check=True)

    cli_cold, _ = timed(lambda: run([a.vm, "exec", "--allow-emulation", "--", "true"]), a.cold)
    sdk_cold_s, _ = timed(sdk_cold, a.cold)
    print(json.dumps({
        "warm_true_ms": {"sdk": round(sdk_warm * 1e3, 2), "cli": round(cli_warm * 1e3, 2),
                         "ratio": round(sdk_warm / cli_warm, 3)},
        "cold_true_s": {"sdk": round(sdk_cold_s, 3), "cli": round(cli_cold, 3),
                        "ratio": round(sdk_cold_s / cli_cold, 3)},
        "runs": {"warm": a.warm, "cold": a.cold},
    }, indent=1))


if __name__ == "__main__":
    main()
