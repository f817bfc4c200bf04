"""An agent framework's tool: run model-written Python in a fresh microVM per call.

The tool hands the model's code to ``python3`` on stdin inside a sandbox with no network
device, capped memory and wall time, and the model's files mounted read-only; whatever the
code does, it is gone when the call returns. Plug ``run_python`` into any framework that
takes a plain function as a tool (its docstring is the tool's description).

    python3 examples/agent_tool.py      # runs one call with a tiny program
"""

import json
import os
import sys

from vm_sandbox import Sandbox, SpecRefused, VmError

# A Python userland: an OCI image in the store (`vm images pull|import`), e.g. the project's
# Debian python3 + numpy image (images/oci-debian.sh). Without one the built-in image
# (busybox) runs the code as a shell script.
IMAGE = os.environ.get("AGENT_TOOL_IMAGE") or None


def run_python(code: str, timeout_s: int = 60) -> str:
    """Run a program (Python 3 in the configured image, else a POSIX shell script) in an
    isolated microVM and return its exit code, stdout and stderr as JSON. The program cannot
    reach the network or the host's files."""
    argv = ["python3", "-"] if IMAGE else ["sh", "-s"]
    try:
        with Sandbox(
            image=IMAGE,
            memory="512M",
            cpus=1,
            timeout=f"{timeout_s + 30}s",   # the VM's whole life, boot included
            env={"PYTHONDONTWRITEBYTECODE": "1"},
            allow_emulation=True,         # accept QEMU emulation where there is no KVM
        ) as sb:
            r = sb.exec(argv, stdin=code.encode(), timeout=timeout_s)
    except SpecRefused as e:              # a refusal names the field; nothing booted
        return json.dumps({"error": f"refused: {e}", "field": e.field})
    except VmError as e:                  # boot failure, wall time, guest error
        return json.dumps({"error": f"{type(e).__name__}: {e}"})
    return json.dumps({
        "exit_code": r.exit_code,
        "stdout": r.stdout.decode("utf-8", "replace")[-10_000:],
        "stderr": r.stderr.decode("utf-8", "replace")[-10_000:],
        "timed_out": r.timed_out,
    })


if __name__ == "__main__":
    code = sys.argv[1] if len(sys.argv) > 1 else "echo hello from $(uname -s) in a microVM"
    print(run_python(code))
