"""`dpgate chat`: a conversation with a running server on the terminal.

Each line typed at the `> ` prompt is a user turn; the answer streams as it is parsed, with the
model's reasoning and tool calls kept apart from its answer (dpgate/cli/chat_view.py), and each
completed exchange is kept and resent (dpgate/cli/chat_conversation.py). Ctrl-C while an answer
streams cancels that call (the gateway resets the upstream stream and the engine aborts the
request), drops the cancelled exchange from the history and returns to the prompt; Ctrl-C at an
empty prompt, Ctrl-D, `/quit` and `/exit` leave with status 0. `/reset` forgets the history.

Bad flags exit 2 with one sentence. The server is asked for its info once at the start, so an
unreachable server or a wrong key exits 1 at once instead of after the first question; after
that a failed call prints `dpgate chat: CODE: message` and the prompt comes back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpgate.cli.chat_conversation import Conversation
from dpgate.cli.chat_view import AnswerView
from dpgate.cli.connection_flags import FlagError, add_connection_arguments, client_from_args
from dpgate.client.chat_messages import ChatInput, ToolCall
from dpgate.client.chat_results import ContentDelta, ToolCallItem
from dpgate.client.clients import DpgateClient, DpgateError, GenerationOptions

PROMPT = "> "
HELP = "/reset forgets the conversation, /quit (or Ctrl-D) leaves; Ctrl-C stops an answer."
# A probe of the server must not hang the start behind a --timeout meant for long answers.
PROBE_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--address", default="127.0.0.1:50051", help="server HOST:PORT (default: %(default)s)")
    add("--system", default=None, metavar="PROMPT", help="system prompt sent first in every request")
    add("--max-tokens", type=int, default=512, help="tokens per answer at most (default: %(default)s)")
    add("--temperature", type=float, default=None, help="0 for greedy (default: the server's)")
    add("--top-p", type=float, default=None)
    add("--top-k", type=int, default=0)
    add("--seed", type=int, default=None)
    add("--thinking", action=argparse.BooleanOptionalAction, default=None,
        help="ask the chat template to think (or not): sends thinking and enable_thinking; "
             "default: the template's own choice")  # fmt: skip
    add("--tools", default=None, metavar="FILE", help="JSON file: a list of tools (name, description, parameters)")
    add("--tool-choice", default=None, help="none, auto, required or a tool's name (default: the server's)")
    add_connection_arguments(
        parser,
        rank_help="pin the calls to this data-parallel rank (metadata x-data-parallel-rank)",
        timeout_help="deadline of each answer in seconds (default: none)",
    )


class ChatSettings:
    """The flags that shape every request, checked once before connecting."""

    def __init__(self, args: argparse.Namespace) -> None:
        if args.max_tokens is not None and args.max_tokens < 1:
            raise FlagError(f"--max-tokens must be at least 1, got {args.max_tokens}.")
        self.options = GenerationOptions(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            seed=args.seed,
        )  # fmt: skip
        self.tools = _tools(args.tools)
        self.tool_choice = _tool_choice(args.tool_choice, self.tools)
        self.chat_template_kwargs = (
            None if args.thinking is None else {"thinking": args.thinking, "enable_thinking": args.thinking}
        )
        self.system = args.system

    def request_arguments(self) -> dict[str, Any]:
        return {"tools": self.tools, "tool_choice": self.tool_choice, "chat_template_kwargs": self.chat_template_kwargs}


def _tools(path: str | None) -> list[Mapping[str, Any]]:
    if path is None:
        return []
    try:
        tools = json.loads(Path(path).read_text())
    except OSError as error:
        raise FlagError(f"--tools {path!r} is not a readable file ({error.strerror}).") from None
    except ValueError as error:
        raise FlagError(f"--tools {path!r} is not JSON ({error}).") from None
    if not isinstance(tools, list):
        raise FlagError(f"--tools {path!r} must hold a JSON list of tools.")
    try:
        ChatInput.build([{"role": "user", "content": ""}], tools)
    except ValueError as error:
        raise FlagError(f"--tools {path!r}: {error}.") from None
    return tools


def _tool_names(tools: list[Mapping[str, Any]]) -> list[str]:
    return [str(tool.get("function", tool).get("name")) for tool in tools]


def _tool_choice(value: str | None, tools: list[Mapping[str, Any]]) -> str | None:
    if value is None or value in ("none", "auto"):
        return value
    if not tools:
        raise FlagError(f"--tool-choice {value} needs --tools.")
    if value != "required" and value not in _tool_names(tools):
        raise FlagError(f"--tool-choice must be none, auto, required or one of the tools' names, got {value!r}.")
    return value


def _error_line(error: DpgateError) -> str:
    return f"dpgate chat: {error.code.name}: {error.message}"


def _answer(
    client: DpgateClient, settings: ChatSettings, conversation: Conversation, view: AnswerView, line: str
) -> None:
    """Stream the answer to `line`; keep the exchange only when the answer completed."""
    content: list[str] = []
    tool_calls: list[ToolCall] = []
    messages = conversation.messages_with(line)
    try:
        with client.chat_stream(messages, settings.options, **settings.request_arguments()) as stream:
            for item in stream:
                view.show(item)
                if isinstance(item, ContentDelta):
                    content.append(item.text)
                elif isinstance(item, ToolCallItem):
                    tool_calls.append(item.tool_call)
    except KeyboardInterrupt:
        # Leaving the `with` cancelled the call; the exchange is not kept.
        view.cancelled()
        return
    except DpgateError as error:
        view.end(None)
        print(_error_line(error), file=sys.stderr, flush=True)
        return
    view.end(stream.finish)
    conversation.record(line, "".join(content), tool_calls)


def _read_line(readline: Any) -> str | None:
    """The next line typed; None to leave (Ctrl-D, or Ctrl-C on an empty line). Ctrl-C on a typed
    line discards it, as a shell does, and returns ""."""
    prompt = PROMPT if sys.stdin.isatty() else ""
    try:
        return input(prompt)
    except EOFError:
        if prompt:
            print()
        return None
    except KeyboardInterrupt:
        typed = readline.get_line_buffer() if readline is not None else ""
        print()
        return "" if typed else None


def _loop(client: DpgateClient, settings: ChatSettings, view: AnswerView) -> None:
    readline = None
    if sys.stdin.isatty():
        # Line editing and history for a person at a terminal only; input() uses it once imported.
        import readline
    conversation = Conversation(settings.system)
    while True:
        line = _read_line(readline)
        if line is None:
            return
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return
        if text == "/reset":
            conversation.reset()
            view.note("[conversation reset]")
        elif text == "/help":
            view.note(HELP)
        elif text.startswith("/") and " " not in text:
            view.note(f"unknown command {text}; {HELP}")
        else:
            _answer(client, settings, conversation, view, line)


def run(args: argparse.Namespace) -> int:
    try:
        settings = ChatSettings(args)
        client = client_from_args(args)
    except FlagError as error:
        print(f"dpgate chat: error: {error}", file=sys.stderr)
        return 2
    styled = sys.stdout.isatty() and os.environ.get("TERM") != "dumb" and "NO_COLOR" not in os.environ
    view = AnswerView(sys.stdout, styled)
    with client:
        try:
            info = client.server_info(timeout=min(PROBE_TIMEOUT_S, args.timeout or PROBE_TIMEOUT_S))
        except DpgateError as error:
            print(_error_line(error), file=sys.stderr)
            return 1
        if sys.stdin.isatty():
            view.note(f"{info.model or 'the model'} at {args.address}; /help for commands, Ctrl-D leaves.")
        _loop(client, settings, view)
    return 0
