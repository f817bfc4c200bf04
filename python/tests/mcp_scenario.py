"""What the MCP tests run on each transport: one session of the official MCP client (PyPI ``mcp``)
against ``vm mcp``, calling every tool on real guests (see test_mcp_stdio.py, test_mcp_http.py).

The server's VMs are its descendant processes (QEMU and vm-vsock on tcg, vm-vmm on kvm): a VM
that is gone has none left, so "no VM" is checked on the process tree, and "no guest process"
with ``ps`` in the guest.
"""

import os
import tempfile
import time
import urllib.request

import anyio

from conftest import descendants

TOOLS = {
    "run",
    "run_code",
    "sandbox_create",
    "sandbox_remove",
    "sandbox_exec",
    "sandbox_read_file",
    "sandbox_write_file",
    "sandbox_list_files",
    "sandbox_serve",
    "sandbox_list",
}
#: The server's default --max-output.
MAX_OUTPUT = 64 * 1024
#: How long a teardown may take before the test calls it lost.
GONE_WITHIN = 30.0


def server_env(tmp_path):
    """A private runtime state directory (short: it holds sockets), a host directory the server
    allows mounting (``--allow-mount``) with one file, and the environment to start it with."""
    rt = tempfile.mkdtemp(prefix="vmrt-", dir="/tmp")
    host_dir = tmp_path / "data"
    host_dir.mkdir()
    (host_dir / "hello.txt").write_text("from the host\n")
    env = dict(os.environ, VM_RUNTIME_DIR=rt)
    env.pop("VM_MCP_TOKEN", None)
    return rt, str(host_dir), env


def alive(pids):
    return {p for p in pids if os.path.exists(f"/proc/{p}")}


async def wait_until(check, what, timeout=GONE_WITHIN):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        await anyio.sleep(0.2)


def data(result):
    """A tool result's structured content, after checking it is not a tool error."""
    assert not result.is_error, result.content
    return result.structured_content


def refused(result, field):
    assert result.is_error, result.structured_content
    s = result.structured_content
    assert s["error"] == "refused" and s["field"] == field, s
    assert field in result.content[0].text, result.content[0].text
    return s


def booted_count(log_path):
    with open(log_path, errors="replace") as f:
        return f.read().count("mcp: VM booted")


async def scenario(c, server_pid, log_path, host_dir):
    """Every tool on one session; leaves the sandbox ``left`` for the session's end."""
    listed = await c.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    assert all(t.input_schema.get("type") == "object" for t in listed.tools)

    # A command in a fresh VM: exit code, stdout and stderr apart; a host directory mounted
    # read-only (the server allows it with --allow-mount).
    r = data(
        await c.call_tool(
            "run",
            {
                "command": "cat /data/hello.txt; echo err >&2; echo x > /data/new || echo ro; exit 3",
                "mounts": [{"host": host_dir, "guest": "/data"}],
            },
        )
    )
    assert r["exit_code"] == 3, r
    assert r["stdout"] == "from the host\nro\n", r
    assert r["stderr"].startswith("err\n"), r
    assert not os.path.exists(os.path.join(host_dir, "new"))

    # Refusals are tool errors naming the argument; nothing boots for them.
    before = booted_count(log_path)
    refused(await c.call_tool("run", {"command": "true", "memory": "64G"}), "memory")
    refused(await c.call_tool("run", {"command": "true", "timeout": "30d"}), "timeout")
    refused(
        await c.call_tool("run", {"command": "true", "mounts": [{"host": "/etc", "guest": "/e"}]}),
        "mounts[0].host",
    )
    refused(await c.call_tool("run", {"command": "true", "image": "nowhere/else:1"}), "image")
    refused(await c.call_tool("sandbox_create", {"keep": True}), "keep")
    assert booted_count(log_path) == before

    # 1 MiB of output: the head kept, the rest counted, and the result says so.
    r = await c.call_tool(
        "run_code", {"language": "sh", "code": "head -c 1048576 /dev/zero | tr '\\0' a; echo done >&2"}
    )
    s = data(r)
    assert s["exit_code"] == 0 and s["stderr"] == "done\n", s
    assert s["stdout_bytes"] == 1 << 20 and s["stdout_truncated"], {k: s[k] for k in s if k != "stdout"}
    assert s["stdout"] == "a" * MAX_OUTPUT
    assert "stdout truncated: 1048576 bytes, the first 65536 shown" in r.content[0].text

    # A sandbox: files, commands, a served port, the listing.
    data(await c.call_tool("sandbox_create", {"name": "box", "memory": "256M"}))
    w = data(
        await c.call_tool(
            "sandbox_write_file", {"name": "box", "path": "www/index.html", "content": "<p>hi</p>\n"}
        )
    )
    assert w["path"] == "/work/www/index.html" and w["bytes"] == 10, w
    r = data(await c.call_tool("sandbox_read_file", {"name": "box", "path": "/work/www/index.html"}))
    assert r["content"] == "<p>hi</p>\n" and r["encoding"] == "utf8" and not r["truncated"], r
    data(
        await c.call_tool(
            "sandbox_write_file",
            {"name": "box", "path": "bin.dat", "content": "AAH/", "encoding": "base64"},
        )
    )
    r = data(await c.call_tool("sandbox_read_file", {"name": "box", "path": "bin.dat"}))
    assert (r["content"], r["encoding"]) == ("AAH/", "base64"), r
    r = data(await c.call_tool("sandbox_list_files", {"name": "box"}))
    assert r["files"] == ["bin.dat", "www/index.html"], r
    r = data(await c.call_tool("sandbox_exec", {"name": "box", "command": "wc -c < www/index.html; pwd"}))
    assert (r["exit_code"], r["stdout"]) == (0, "10\n/work\n"), r
    refused(await c.call_tool("sandbox_read_file", {"name": "box", "path": "../etc/passwd"}), "path")
    r = await c.call_tool("sandbox_exec", {"name": "nobox", "command": "true"})
    assert r.is_error and r.structured_content["error"] == "not_found", r.structured_content
    r = data(
        await c.call_tool(
            "sandbox_serve",
            {
                "name": "box",
                "command": "exec httpd -f -p 8000 -h /work/www",
                "port": 8000,
                "ready_path": "/index.html",
            },
        )
    )
    url = r["url"]
    assert url.startswith("http://127.0.0.1:"), r
    body = await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url + "/index.html", timeout=30).read())
    assert body == b"<p>hi</p>\n"
    r = data(await c.call_tool("sandbox_list", {}))
    [box] = [b for b in r["sandboxes"] if b["name"] == "box"]
    assert box["state"] == "running" and box["urls"] == [url] and not box["kept"], r

    # Four calls at once, two booting VMs, two in the sandbox: each gets its own result.
    results = {}

    async def call(key, tool, args):
        results[key] = data(await c.call_tool(tool, args))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "a", "run", {"command": "echo a"})
        tg.start_soon(call, "b", "run_code", {"language": "sh", "code": "echo b"})
        tg.start_soon(call, "c", "sandbox_exec", {"name": "box", "command": "sleep 1; echo c"})
        tg.start_soon(call, "d", "sandbox_exec", {"name": "box", "command": "echo d >&2"})
    assert {k: (v["stdout"], v["stderr"]) for k, v in results.items()} == {
        "a": ("a\n", ""),
        "b": ("b\n", ""),
        "c": ("c\n", ""),
        "d": ("", "d\n"),
    }

    box_vm = await wait_until(lambda: alive(descendants(server_pid)), "the sandbox's VM processes")

    # A cancelled call in the sandbox: its command tree is killed, the sandbox stays.
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def long_exec():
            with scope:
                await c.call_tool(
                    "sandbox_exec", {"name": "box", "command": "touch started; sh -c 'sleep 321'"}
                )
            assert scope.cancelled_caught, "the call ended before it was cancelled"

        tg.start_soon(long_exec)
        await wait_until_started(c)
        scope.cancel()

    async def no_sleep():
        r = data(await c.call_tool("sandbox_exec", {"name": "box", "command": "ps"}))
        return "sleep 321" not in r["stdout"]

    await wait_async(no_sleep, "the cancelled command's process tree gone from the guest")

    # A cancelled call in a fresh VM: the VM is torn down.
    booted = booted_count(log_path)
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def long_run():
            with scope:
                await c.call_tool("run", {"command": "sleep 321"})
            assert scope.cancelled_caught, "the call ended before it was cancelled"

        tg.start_soon(long_run)
        await wait_until(lambda: booted_count(log_path) > booted, "the run's VM booted", 300)
        await wait_until(lambda: alive(descendants(server_pid)) - box_vm, "the run's VM processes")
        await anyio.sleep(1)
        scope.cancel()
    await wait_until(lambda: alive(descendants(server_pid)) <= box_vm, "the cancelled run's VM gone")

    # Removing the sandbox leaves no VM.
    data(await c.call_tool("sandbox_remove", {"name": "box"}))
    await wait_until(lambda: not alive(descendants(server_pid)), "the removed sandbox's VM gone")
    r = data(await c.call_tool("sandbox_list", {}))
    assert "box" not in [b["name"] for b in r["sandboxes"]], r

    # A sandbox the session's end must remove.
    data(await c.call_tool("sandbox_create", {"name": "left"}))
    return await wait_until(lambda: alive(descendants(server_pid)), "the sandbox left's VM")


async def wait_until_started(c):
    async def started():
        r = await c.call_tool("sandbox_read_file", {"name": "box", "path": "started"})
        return not r.is_error

    await wait_async(started, "the long command started", 120)


async def wait_async(check, what, timeout=GONE_WITHIN):
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        await anyio.sleep(0.3)
