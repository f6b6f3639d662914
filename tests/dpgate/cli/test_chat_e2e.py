"""`dpgate chat` with its stdin and stdout not a terminal, against a real engine (the tiny Llama).

The engine's --chat-template thinks by default (a Qwen3-like template that opens `<think>`), so
its output is reasoning unless the user opts out: piped, every reasoning line carries the plain
`thinking: ` prefix and no escape codes; `--no-thinking` reaches the template through
chat_template_kwargs and the same question is answered as content. A server error mid-conversation
prints one line and the loop goes on to the next question, exiting 0 at the end of input.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest

from dpgate.cli.chat_view import REASONING_PREFIX
from dpgate.client import DpgateClient, GenerationOptions
from tests.support.gateway_processes import PYTHON, ROOT, EngineProcess
from tests.tiny_model import make_tiny_llama_dir

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)
# Seeded sampling: the tiny model's greedy output is only newlines; a seed makes words, repeatably.
FLAGS = ["--max-tokens", "12", "--seed", "7"]
OPTIONS = GenerationOptions(max_tokens=12, seed=7)


class ThinkingEngine(EngineProcess):
    def __init__(self, model: Path, log_dir: Path, template: Path) -> None:
        super().__init__(model, 0, 1, log_dir)
        self.log_path = log_dir / "chat-command-engine.log"
        self.template = template

    def command(self) -> list[str]:
        return [*super().command(), "--chat-template", str(self.template)]


@pytest.fixture(scope="module")
def thinking_engine(tmp_path_factory: pytest.TempPathFactory, log_dir: Path):
    directory = tmp_path_factory.mktemp("chat-command")
    template = directory / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    engine = ThinkingEngine(make_tiny_llama_dir(directory / "tiny"), log_dir, template)
    engine.start()
    try:
        engine.wait_serving()
        yield engine
    finally:
        engine.stop()


def chat(address: str, lines: list[str], *flags: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "DPGATE_API_KEY"}
    return subprocess.run(
        [PYTHON, "-m", "dpgate.cli", "chat", "--address", address, *flags],
        input="".join(f"{line}\n" for line in lines), capture_output=True, text=True, timeout=120,
        cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
    )  # fmt: skip


def test_piped_reasoning_lines_carry_the_plain_prefix(thinking_engine) -> None:
    with DpgateClient(thinking_engine.address, timeout=60) as client:
        expected = client.chat([{"role": "user", "content": "Hello"}], OPTIONS)
    assert expected.reasoning_content.strip() and not expected.content
    done = chat(thinking_engine.address, ["Hello"], *FLAGS)
    assert done.returncode == 0 and done.stderr == ""
    body, note = done.stdout.removesuffix("\n").rsplit("\n", 1)
    assert note == "[answer cut short: --max-tokens reached]"
    lines = body.split("\n")
    assert all(line.startswith(REASONING_PREFIX) for line in lines if line), done.stdout
    assert "\x1b" not in done.stdout and not done.stdout.startswith(">")
    shown = "\n".join(line.removeprefix(REASONING_PREFIX) for line in lines)
    assert shown == expected.reasoning_content.strip("\n")


def test_no_thinking_reaches_the_template_and_the_answer_is_content(thinking_engine) -> None:
    with DpgateClient(thinking_engine.address, timeout=60) as client:
        expected = client.chat(
            [{"role": "user", "content": "Hello"}], OPTIONS,
            chat_template_kwargs={"thinking": False, "enable_thinking": False},
        )  # fmt: skip
    assert expected.content.strip() and not expected.reasoning_content
    done = chat(thinking_engine.address, ["Hello"], *FLAGS, "--no-thinking")
    assert done.returncode == 0 and done.stderr == ""
    assert REASONING_PREFIX not in done.stdout
    assert done.stdout.startswith(expected.content.strip("\n").split("\n", 1)[0])


def test_a_server_error_prints_one_line_and_the_next_question_is_answered(thinking_engine) -> None:
    done = chat(thinking_engine.address, ["first", "/reset", "second"], "--max-tokens", "1000000")
    assert done.returncode == 0
    errors = done.stderr.splitlines()
    assert len(errors) == 2 and all(line.startswith("dpgate chat: INVALID_ARGUMENT: ") for line in errors), done.stderr
    assert "[conversation reset]" in done.stdout


def test_tool_calls_are_printed_as_calls_and_kept_in_the_history(smollm2_chat_server, tmp_path) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = tmp_path / "tools.json"
    tools.write_text(
        json.dumps([{"name": "get_weather", "description": "Current weather in a city", "parameters": schema}])
    )
    flags = ["--tools", str(tools), "--tool-choice", "required", "--max-tokens", "40", "--temperature", "0"]
    done = chat(smollm2_chat_server.gateway.address, ["What is the weather in Paris?", "And in Rome?"], *flags)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    calls = [line for line in done.stdout.splitlines() if line.startswith("tool call ")]
    assert len(calls) >= 2, done.stdout  # one or more per answer; the second answer saw the first's calls
    for line in calls:
        name, arguments = line.removeprefix("tool call ").split("(", 1)
        assert name == "get_weather"
        jsonschema.validate(json.loads(arguments.removesuffix(")")), schema)
