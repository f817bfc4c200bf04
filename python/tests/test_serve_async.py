"""Serving through published ports, and the asyncio flavour."""

import asyncio
import urllib.error
import urllib.request

import pytest

from vm_sandbox import AsyncSandbox, SpecRefused

from conftest import boot


def test_serve_is_reachable_and_closed_on_exit():
    with boot(memory="128M") as sb:
        sb.files.write("www/health", b"ok\n")
        with sb.serve(["busybox", "httpd", "-f", "-h", "/work/www", "-p", "127.0.0.1:8080"],
                      ports=["0:8080"], ready="/health") as srv:
            assert srv.url.startswith("http://127.0.0.1:")
            with urllib.request.urlopen(srv.url + "/health", timeout=30) as r:
                assert r.read() == b"ok\n"
            url = srv.url
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url + "/health", timeout=5)


def test_non_loopback_publish_is_refused(sb):
    with pytest.raises(SpecRefused) as e:
        sb.serve(["true"], ports=["0.0.0.0:0:8080"])
    assert e.value.field == "ports"


def test_asyncio_gather_of_eight(guest_host):
    async def one(i):
        async with AsyncSandbox(memory="128M", allow_emulation=True) as sb:
            r = await sb.exec(["sh", "-c", f"echo {i}"])
            return r.stdout

    async def main():
        return await asyncio.gather(*(one(i) for i in range(8)))

    assert asyncio.run(main()) == [f"{i}\n".encode() for i in range(8)]


def test_async_stream_and_files(guest_host):
    async def main():
        async with AsyncSandbox(memory="128M", allow_emulation=True) as sb:
            await sb.files.write("x.txt", b"hi")
            assert await sb.files.read("x.txt") == b"hi"
            kinds = [ev.kind async for ev in sb.exec_stream(["sh", "-c", "echo a; echo b >&2"])]
            assert kinds[-1] == "exit" and "stdout" in kinds and "stderr" in kinds

    asyncio.run(main())


def test_cancelling_an_async_exec_kills_the_guest_command(guest_host):
    async def main():
        async with AsyncSandbox(memory="128M", allow_emulation=True) as sb:
            task = asyncio.ensure_future(sb.exec(["sh", "-c", "sleep 120; echo never"]))
            await asyncio.sleep(2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.5)
            ps = (await sb.exec(["ps"])).stdout
            assert b"sleep 120" not in ps, ps

    asyncio.run(main())
