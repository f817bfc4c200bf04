#!/usr/bin/env python3
"""Side-by-side benchmark of `vm` builds on the tcg road: forwarded throughput and requests
per second through `vm serve`, and the `vm exec NAME -- true` round trip, alternating the
builds round by round so machine load falls on each alike.

    ci/bench-vsock.py --vm ours=target/release/vm --vm old=/path/to/old/vm [--rounds 3]

Each build serves busybox httpd in a tcg guest (`vm serve --allow-emulation -v DIR:/srv:ro`):
throughput = a 64 MiB body GET twice per round; req/s = 4 client threads GETting a 1 KiB file
for 5 s (busybox httpd closes every connection, so each request is a new forwarded connection
and a new vsock stream); exec = 20 `vm exec NAME -- true`. Prints one line per build with the
medians over rounds. Used for docs/benchmarks.md (our vm-vsock vs vhost-device-vsock 0.3.0).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BIG = 64 << 20


def start(vm, name, srv):
    cmd = [vm, "serve", "--allow-emulation", "--name", name, "-v", f"{srv}:/srv:ro",
           "-p", "0:8000", "--ready", "/small", "--",
           "httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/srv"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = p.stdout.readline().strip()
    if not url.startswith("http://"):
        p.kill()
        sys.exit(f"{vm} serve printed {url!r}: {p.stderr.read()[-2000:]}")
    return p, url


def throughput(url):
    rates = []
    for _ in range(2):
        t0 = time.monotonic()
        n = 0
        with urllib.request.urlopen(f"{url}/big", timeout=120) as r:
            while chunk := r.read(1 << 20):
                n += len(chunk)
        if n != BIG:
            sys.exit(f"GET /big returned {n} bytes")
        rates.append(n / (time.monotonic() - t0) / 1e6)
    return statistics.median(rates)


def req_per_s(url, threads=4, secs=5.0):
    count = [0] * threads
    errors = [0] * threads
    end = time.monotonic() + secs

    def client(i):
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"{url}/small", timeout=10) as r:
                    r.read()
                count[i] += 1
            except OSError:
                errors[i] += 1

    ts = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if sum(errors):
        print(f"  {sum(errors)} failed requests", file=sys.stderr)
    return sum(count) / secs


def exec_p50(vm, name, n=20):
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        subprocess.run([vm, "exec", name, "--", "true"], check=True)
        times.append(time.monotonic() - t0)
    return statistics.median(times) * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vm", action="append", required=True, help="LABEL=PATH of a vm binary")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    builds = [v.split("=", 1) for v in args.vm]
    results = {label: {"MB/s": [], "req/s": [], "exec ms": []} for label, _ in builds}
    with tempfile.TemporaryDirectory() as srv:
        with open(os.path.join(srv, "big"), "wb") as f:
            f.write(os.urandom(BIG))
        with open(os.path.join(srv, "small"), "wb") as f:
            f.write(b"x" * 1024)
        for rnd in range(args.rounds):
            order = builds if rnd % 2 == 0 else builds[::-1]
            for label, vm in order:
                name = f"bench-{label}-{os.getpid()}"
                p, url = start(vm, name, srv)
                try:
                    r = results[label]
                    r["MB/s"].append(throughput(url))
                    r["req/s"].append(req_per_s(url))
                    r["exec ms"].append(exec_p50(vm, name))
                    print(f"round {rnd + 1} {label}: {r['MB/s'][-1]:.1f} MB/s, "
                          f"{r['req/s'][-1]:.1f} req/s, exec p50 {r['exec ms'][-1]:.1f} ms",
                          flush=True)
                finally:
                    subprocess.run([vm, "stop", name], capture_output=True)
                    p.wait(timeout=60)
                    subprocess.run([vm, "rm", name], capture_output=True)
    for label, r in results.items():
        print(f"{label}: " + ", ".join(
            f"{k} median {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
            for k, v in r.items()))


if __name__ == "__main__":
    main()
