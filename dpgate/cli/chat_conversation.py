"""The history `dpgate chat` resends each turn: system prompt, then user and assistant messages.

A turn enters the history only once its answer is complete. A cancelled or failed answer leaves
no trace, and neither does the question that asked for it, so the next request reads as if that
exchange never happened (no dangling user message, no half answer the model would continue).
The assistant's content and tool calls are kept; its reasoning is not resent, as chat templates
drop earlier reasoning anyway and it would cost context for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpgate.client.chat_messages import ChatMessage, ToolCall


class Conversation:
    """The messages of one conversation; `system` (when given) stays first across `reset`."""

    def __init__(self, system: str | None = None) -> None:
        self._system = system
        self._turns: list[ChatMessage] = []

    @property
    def num_turns(self) -> int:
        """Completed exchanges (a user message and its answer)."""
        return sum(1 for message in self._turns if message.role == "user")

    def reset(self) -> None:
        self._turns.clear()

    def messages_with(self, user_text: str) -> list[ChatMessage]:
        """What to send for a new question: the history, then `user_text`; the history is unchanged."""
        head = [ChatMessage("system", self._system)] if self._system else []
        return [*head, *self._turns, ChatMessage("user", user_text)]

    def record(self, user_text: str, content: str, tool_calls: Sequence[ToolCall]) -> None:
        """Keep a completed exchange: the question and the assistant's content and tool calls."""
        self._turns.append(ChatMessage("user", user_text))
        self._turns.append(ChatMessage("assistant", content, tool_calls=tuple(tool_calls)))
