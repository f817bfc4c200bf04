"""``vm mcp --http`` (streamable HTTP on loopback with a bearer token), driven by the official MCP
Python SDK's client (PyPI ``mcp``): a non-loopback address is refused, a request without the
token is answered 401, then every tool on real guests over one session, and the session's end
(the client deletes it) removing its sandboxes while the server stays (mcp_scenario.py).
"""

import shutil
import signal
import subprocess
import urllib.error
import urllib.request

import anyio
import pytest
from conftest import vm_bin
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_scenario import GONE_WITHIN, alive, scenario, server_env, wait_until


def test_a_non_loopback_address_is_refused():
    for addr in ("0.0.0.0:0", "[::]:0", "192.0.2.1:8000"):
        p = subprocess.run(
            [vm_bin(), "mcp", "--http", addr, "--allow-emulation"], capture_output=True, timeout=60
        )
        assert p.returncode == 126, (addr, p.returncode, p.stderr)
        assert b"refused" in p.stderr and b"loopback" in p.stderr, p.stderr
        assert p.stdout == b"", "nothing served, so no URL or token printed"


@pytest.fixture
def server(tmp_path):
    rt, host_dir, env = server_env(tmp_path)
    log_path = str(tmp_path / "server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [vm_bin(), "-v", "mcp", "--http", "127.0.0.1:0", "--allow-emulation", "--allow-mount", host_dir],
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
    )
    url = proc.stdout.readline().decode().strip()
    auth = proc.stdout.readline().decode().strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp"), (url, auth)
    assert auth.startswith("Authorization: Bearer ") and len(auth.split()[-1]) == 64, auth
    yield proc, url, auth.split()[-1], log_path, host_dir
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        proc.kill()
        log.close()
        shutil.rmtree(rt, ignore_errors=True)


def _post(url, token=None):
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json, text/event-stream")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_mcp_over_streamable_http(guest_host, server):
    proc, url, token, log_path, host_dir = server
    assert _post(url) == 401
    assert _post(url, "x" * 64) == 401
    assert _post(url, token[:-1]) == 401
    assert _post(url, token) != 401, "the token is the one printed"

    async def session():
        headers = {"Authorization": f"Bearer {token}"}
        async with create_mcp_http_client(headers=headers) as http:
            async with Client(streamable_http_client(url, http_client=http)) as c:
                left = await scenario(c, proc.pid, log_path, host_dir)
        # The client deleted its session: the session's VMs are gone, the server serves on.
        await wait_until(lambda: not alive(left), "the session's VMs gone after it ended", GONE_WITHIN)
        assert proc.poll() is None, "the server stays up"

    anyio.run(session)
    assert _post(url, token) != 401
