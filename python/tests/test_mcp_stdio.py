"""``vm mcp`` over stdio, driven by the official MCP Python SDK's client (PyPI ``mcp``), as an agent
host starts it: every tool on real guests, then the session's end removing its sandboxes, and a
sandbox kept by name outliving it for a second session (mcp_scenario.py has the steps).

The server is the CLI the workspace built (conftest.vm_bin) with a private runtime state
directory; the client passes the environment on, as an agent host's config does.
"""

import json
import os
import shutil
import subprocess

import anyio
import pytest
from conftest import vm_bin
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_scenario import GONE_WITHIN, alive, data, scenario, server_env, wait_until


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


def _server_pid(binary):
    """The ``vm mcp`` process the client started (a child of this one)."""
    real = os.path.realpath(binary)
    for pid in _children(os.getpid()):
        try:
            if os.path.realpath(f"/proc/{pid}/exe") == real:
                return pid
        except OSError:
            continue
    raise AssertionError("the client started no vm mcp process")


@pytest.fixture
def setup(tmp_path):
    rt, host_dir, env = server_env(tmp_path)
    yield rt, host_dir, env, str(tmp_path / "server.log")
    subprocess.run([vm_bin(), "rm", "-f", "keeper", "userbox"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(rt, ignore_errors=True)


def _params(env, host_dir):
    return StdioServerParameters(
        command=vm_bin(),
        args=["-v", "mcp", "--allow-emulation", "--allow-mount", host_dir],
        env=env,
    )


def test_mcp_over_stdio(guest_host, setup):
    rt, host_dir, env, log_path = setup

    async def first_session():
        with open(log_path, "w") as log:
            async with Client(stdio_client(_params(env, host_dir), errlog=log)) as c:
                server = _server_pid(vm_bin())
                left = await scenario(c, server, log_path, host_dir)
                r = data(await c.call_tool("sandbox_create", {"name": "keeper", "keep": True}))
                assert r["kept"], r
        # The session ended with stdin: its sandboxes are gone, the kept one is not.
        await wait_until(lambda: not alive(left), "the session's VMs gone after it ended", GONE_WITHIN)
        return left

    anyio.run(first_session)
    ps = subprocess.run([vm_bin(), "ps", "--json"], env=env, capture_output=True, timeout=60)
    names = {v["name"]: v for v in json.loads(ps.stdout)}
    assert names["keeper"]["state"] == "running", names
    assert names["keeper"]["labels"].get("vm.mcp") == "kept", names

    # A VM the user started by hand is not the agent's: the tools do not reach it.
    user = subprocess.run(
        [vm_bin(), "run", "-d", "--name", "userbox", "--allow-emulation"], env=env, capture_output=True, timeout=600
    )
    assert user.returncode == 0, user.stderr.decode()

    async def second_session():
        with open(log_path, "a") as log:
            async with Client(stdio_client(_params(env, host_dir), errlog=log)) as c:
                listed = data(await c.call_tool("sandbox_list", {}))
                assert [(b["name"], b["kept"]) for b in listed["sandboxes"]] == [("keeper", True)]
                r = data(await c.call_tool("sandbox_exec", {"name": "keeper", "command": "echo still here"}))
                assert r["stdout"] == "still here\n", r
                for tool in ("sandbox_exec", "sandbox_remove"):
                    r = await c.call_tool(tool, {"name": "userbox", "command": "true"})
                    assert r.is_error and r.structured_content["error"] == "not_found", r.structured_content
                data(await c.call_tool("sandbox_remove", {"name": "keeper"}))

    anyio.run(second_session)
    ps = subprocess.run([vm_bin(), "ps", "--json"], env=env, capture_output=True, timeout=60)
    assert [v["name"] for v in json.loads(ps.stdout)] == ["userbox"]
