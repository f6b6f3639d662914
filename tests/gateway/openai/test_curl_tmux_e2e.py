"""The README's HTTP quick start on a real terminal (tmux): `dpgate serve` (SmolLM2, the packaged
default, only the ports chosen free), then a chat answer streamed with `curl -sN` typed into a shell.

The screen must show server-sent events as OpenAI's clients read them: `data: {json}` chunks of
`chat.completion.chunk` whose contents, joined, are the answer the `openai` package gets for the
same request unstreamed, a last chunk with the finish reason, then `data: [DONE]` and the shell's prompt.
"""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from tests.support.processes import free_port, running
from tests.support.tmux_session import open_terminal

QUESTION = "What is the capital of France?"
MAX_TOKENS = 12


@pytest.fixture
def served(log_dir):
    """`dpgate serve --port P --http-port H` on free ports, awaited until SERVING: (gRPC, HTTP) ports."""
    port, http_port = free_port(), free_port()
    flags = ["serve", "--port", str(port), "--http-port", str(http_port)]
    with running(flags, port, timeout=120, log_path=str(log_dir / "http-quick-start-serve.log")):
        yield port, http_port


@pytest.fixture
def terminal(tmp_path):
    with open_terminal(tmp_path, 400, 50) as session:
        yield session


def curl_command(http_port: int) -> str:
    body = {"stream": True, "max_tokens": MAX_TOKENS, "temperature": 0,
            "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
    return (
        f"curl -sN http://127.0.0.1:{http_port}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-d '{json.dumps(body)}'"
    )


def test_a_chat_answer_streamed_with_curl_on_a_terminal(served, terminal):
    _, http_port = served
    client = OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="none", timeout=60)
    expected = client.chat.completions.create(
        model="", max_tokens=MAX_TOKENS, temperature=0, messages=[{"role": "user", "content": QUESTION}]
    )
    command = curl_command(http_port)
    terminal.type_line(command)
    history = terminal.wait_for(lambda text: text.rstrip().split("\n")[-3:] == ["data: [DONE]", "", "$"], timeout=60)
    print(f"The terminal showed:\n{terminal.screen()}")  # the README's HTTP quick start quotes this screen

    rows = [row.rstrip() for row in history.rstrip().split("\n")]
    start = rows.index(f"$ {command}")
    events = [row for row in rows[start + 1 : -1] if row]
    assert events[-1] == "data: [DONE]"
    assert all(event.startswith("data: {") for event in events[:-1])
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    assert content == expected.choices[0].message.content and content
    assert chunks[-1]["choices"][0]["finish_reason"] == expected.choices[0].finish_reason
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-1])
