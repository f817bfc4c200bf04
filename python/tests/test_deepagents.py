"""A Deep Agents agent (``create_deep_agent``) with ``VmSandboxBackend``, driven by LangChain's own
fake chat model (a scripted test double: nothing reaches the network): the model writes a Python
file with the agent's ``write_file`` tool, then runs it with its ``execute`` tool; both run in a
microVM through the backend, the results come back as the run's tool messages, and the VM is
gone once the backend is closed.

Deep Agents runs its file tools as python3 programs in the sandbox, so the guest's root is the
project's Debian python3 image (images/rootfs-debian.sh, built by ci/setup-tests.sh).
"""

import os
import subprocess

import pytest
from conftest import REPO
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from vm_sandbox.integrations.deepagents import TESTED_WITH, VmSandboxBackend


class ToolCallingFake(GenericFakeChatModel):
    """LangChain's scripted chat model, accepting the agent's tools (it calls them by script)."""

    def bind_tools(self, tools, **kwargs):
        return self


def _debian_rootfs():
    p = subprocess.run(
        [os.path.join(REPO, "images", "rootfs-debian.sh"), "--print-path"], capture_output=True, text=True
    )
    if p.returncode != 0:
        pytest.skip("no Debian python3 root built on this host (images/rootfs-debian.sh, ci/setup-tests.sh)")
    return p.stdout.strip()


def test_a_deep_agent_works_in_a_microvm(guest_host):
    assert TESTED_WITH.startswith("deepagents")
    rootfs = _debian_rootfs()
    script = [
        AIMessage(
            content="",
            tool_calls=[
                {
                    "name": "write_file",
                    "args": {"file_path": "/work/notes/hello.py", "content": "import os\nprint(6 * 7, os.getcwd())\n"},
                    "id": "write-1",
                }
            ],
        ),
        AIMessage(
            content="",
            tool_calls=[
                {
                    "name": "execute",
                    "args": {"command": "cd /work && python3 notes/hello.py && uname -s"},
                    "id": "exec-1",
                }
            ],
        ),
        AIMessage(content="done"),
    ]
    with VmSandboxBackend(rootfs=rootfs, allow_emulation=True, memory="512M", timeout="10m") as backend:
        pids = backend.sandbox.host_pids()
        assert pids
        agent = create_deep_agent(model=ToolCallingFake(messages=iter(script)), backend=backend)
        out = agent.invoke({"messages": [{"role": "user", "content": "write hello.py and run it"}]})
        tools = {m.tool_call_id: m.content for m in out["messages"] if m.type == "tool"}
        assert set(tools) == {"write-1", "exec-1"}, tools
        assert "/work/notes/hello.py" in tools["write-1"] and "rror" not in tools["write-1"], tools
        assert "42 /work\nLinux" in tools["exec-1"], tools
        assert out["messages"][-1].content == "done"
        # The file is in the VM, not on this host.
        assert backend.sandbox.files.read("notes/hello.py") == b"import os\nprint(6 * 7, os.getcwd())\n"
        assert not os.path.exists("/work/notes/hello.py")
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")], pids
