"""The OpenAI Agents SDK's own ``Runner`` drives ``VmSandboxClient`` through a real agent turn, with
a scripted model in place of a real one (the SDK takes any ``Model``; nothing reaches the
network): the model writes a file with the SDK's ``apply_patch`` tool, then runs a shell command
with its ``exec_command`` tool that reads the file back; the SDK executes both through our
client in a microVM, the results come back in the run's items, and the session's VM is gone
when the run has ended.
"""

import asyncio
import os

from agents import Runner, set_tracing_disabled
from agents.items import ModelResponse, ToolCallOutputItem
from agents.models.interface import Model
from agents.run import RunConfig
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.usage import Usage
from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from vm_sandbox.integrations.openai_agents import (
    TESTED_WITH,
    VmSandboxClient,
    VmSandboxClientOptions,
    VmSandboxSession,
)

PATCH = "*** Begin Patch\n*** Add File: notes/hello.txt\n+hello from the model\n*** End Patch\n"
COMMAND = "cat notes/hello.txt; echo; uname -s; echo $((6*7)); pwd"


class RecordingClient(VmSandboxClient):
    """The client under test, remembering the sessions it made."""

    def __init__(self):
        super().__init__()
        self.sessions = []

    async def create(self, **kwargs):
        session = await super().create(**kwargs)
        self.sessions.append(session._inner)
        return session


class ScriptedModel(Model):
    """Answers each turn from a script; the second turn records the VM's host processes."""

    def __init__(self, client):
        self.client = client
        self.turn = 0
        self.tools_seen = []
        self.vm_pids = []

    async def get_response(self, system_instructions, input, model_settings, tools, *args, **kwargs):
        self.turn += 1
        self.tools_seen.append(sorted(t.name for t in tools))
        if self.turn == 1:
            out = [ResponseCustomToolCall(type="custom_tool_call", call_id="patch-1", name="apply_patch", input=PATCH)]
        elif self.turn == 2:
            [session] = self.client.sessions
            assert isinstance(session, VmSandboxSession)
            self.vm_pids = session._sb.sync.host_pids()
            out = [
                ResponseFunctionToolCall(
                    type="function_call",
                    call_id="exec-1",
                    name="exec_command",
                    arguments=f'{{"cmd": "{COMMAND}", "yield_time_ms": 120000}}',
                )
            ]
        else:
            out = [
                ResponseOutputMessage(
                    id="msg-1",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text="done", annotations=[])],
                )
            ]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the test runs Runner.run, not streamed")


def test_the_sdk_runs_a_turn_in_a_microvm(guest_host):
    assert TESTED_WITH.startswith("openai-agents")
    set_tracing_disabled(True)
    client = RecordingClient()
    model = ScriptedModel(client)
    agent = SandboxAgent(name="coder", instructions="Write the file, then run the command.", model=model)
    config = RunConfig(
        tracing_disabled=True,
        sandbox=SandboxRunConfig(
            client=client, options=VmSandboxClientOptions(allow_emulation=True, memory="256M", timeout="10m")
        ),
    )
    result = asyncio.run(Runner.run(agent, "write notes/hello.txt, then show it", run_config=config))

    assert result.final_output == "done"
    assert model.turn == 3
    assert {"apply_patch", "exec_command"} <= set(model.tools_seen[0]), model.tools_seen[0]
    outputs = {
        item.raw_item["call_id"] if isinstance(item.raw_item, dict) else item.raw_item.call_id: str(item.output)
        for item in result.new_items
        if isinstance(item, ToolCallOutputItem)
    }
    assert set(outputs) == {"patch-1", "exec-1"}, outputs
    shell = outputs["exec-1"]
    assert "hello from the model\nLinux\n42\n/workspace" in shell, shell
    assert "Process exited with code 0" in shell, shell

    # The run ended: the session was shut down and its VM is gone.
    [session] = client.sessions
    assert session._sb is None
    assert model.vm_pids, "the VM had host processes while it ran"
    assert not [p for p in model.vm_pids if os.path.exists(f"/proc/{p}")], model.vm_pids
