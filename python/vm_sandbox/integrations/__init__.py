"""Sandbox providers for the agent frameworks people run, on ``vm_sandbox``'s public API.

Each lives in its own module and imports its framework only when imported itself, so the
base wheel needs none (the frameworks are optional extras):

- ``vm_sandbox.integrations.openai_agents``: a sandbox client for the OpenAI Agents SDK
  (``pip install 'vm-sandbox[openai-agents]'``): ``SandboxRunConfig(client=VmSandboxClient())``.
- ``vm_sandbox.integrations.deepagents``: a sandbox backend for LangChain's Deep Agents
  (``pip install 'vm-sandbox[deepagents]'``): ``create_deep_agent(backend=VmSandboxBackend())``.

Each module's ``TESTED_WITH`` names the framework version range its tests ran against (the
same range its extra declares). docs/agents.md has the setup and what the guarantees mean.
"""
