"""The model-server path from Python: the llama.cpp image (images/llama-server.sh) imported
with ``vm_sandbox.images``, served by ``Sandbox.serve`` with the tiny model mounted read-only,
and queried by the official ``openai`` client (the llama venv's, through the CLI test's
script)."""

import json
import os
import pathlib
import subprocess

import pytest

from vm_sandbox import images

from conftest import boot

REPO = pathlib.Path(__file__).resolve().parents[2]
NAME = "vm.local/llama-server:sdk-test"


def _artifacts():
    out = subprocess.run(
        ["bash", str(REPO / "images/llama-server.sh"), "--print-path"], capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.fail("the llama.cpp image is not built (images/llama-server.sh, which ci/setup-tests.sh runs)")
    return pathlib.Path(out.stdout.strip())


def test_llama_server_answers_the_openai_client(tmp_path, monkeypatch):
    art = _artifacts()
    monkeypatch.setenv("VM_OCI_DIR", str(tmp_path / "oci"))
    image = images.import_(art / "oci", NAME)
    assert image["digest"].startswith("sha256:") and NAME in image["refs"]
    assert [i["digest"] for i in images.list()] == [image["digest"]]

    with boot(image=NAME, mounts={str(art / "models"): "/models"}) as sb:
        argv = ["llama-server", "-m", "/models/tiny.gguf", "--host", "127.0.0.1", "--port", "8080"]
        with sb.serve(argv, ports=["0:8080"], ready="/health", ready_timeout=600) as srv:
            client = subprocess.run(
                [str(art / "python"), str(REPO / "cli/tests/llama/openai_client.py"), srv.url, "8"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert client.returncode == 0, client.stderr
            reply = json.loads(client.stdout)
        assert not srv.running
    chat = reply["chat"]
    assert (chat["object"], chat["role"], chat["finish_reason"]) == ("chat.completion", "assistant", "length"), reply
    assert chat["completion_tokens"] == 8
    assert reply["stream"]["finish_reason"] == "length" and reply["stream"]["chunks"]
    assert "".join(reply["stream"]["chunks"]) == reply["plain"]["text"], "greedy: streamed == plain"

    refs, deleted = images.remove(NAME)
    assert refs == [NAME] and deleted
    assert images.list() == []
