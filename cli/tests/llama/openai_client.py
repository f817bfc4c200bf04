#!/usr/bin/env python3
"""The official `openai` client against a llama.cpp server (tests/llama_server.rs).

    openai_client.py BASE_URL MAX_TOKENS

Asks for one chat completion, one streamed completion and the same completion unstreamed, all
greedy (temperature 0), and prints what came back as one JSON document for the test to assert
on. Any client error propagates (non-zero exit with the traceback on stderr).
"""

import json
import sys

from openai import OpenAI

PROMPT = "Once upon a time"


def main() -> None:
    base, max_tokens = sys.argv[1], int(sys.argv[2])
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=600.0, max_retries=0)

    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=max_tokens,
        temperature=0,
    )
    chunks, finish = [], None
    for event in client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=max_tokens, temperature=0, stream=True
    ):
        for choice in event.choices:
            if choice.text:
                chunks.append(choice.text)
            if choice.finish_reason:
                finish = choice.finish_reason
    plain = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=max_tokens, temperature=0
    )
    json.dump(
        {
            "chat": {
                "object": chat.object,
                "role": chat.choices[0].message.role,
                "content": chat.choices[0].message.content,
                "finish_reason": chat.choices[0].finish_reason,
                "completion_tokens": chat.usage.completion_tokens,
            },
            "stream": {"chunks": chunks, "finish_reason": finish},
            "plain": {
                "text": plain.choices[0].text,
                "finish_reason": plain.choices[0].finish_reason,
                "completion_tokens": plain.usage.completion_tokens,
            },
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
