"""An engine's GetLoad figures, aged by what this gateway has seen end since they were asked.

GetLoad is polled once a health interval, so between polls its figures describe calls that may
have ended. Left as they are, an engine that has just finished calls looks busier than one that
sat idle until its next poll, and sequential calls (a conversation's turns, a client's one-at-a-
time loop) all go to the engine that happened to be idle when it was last asked. So every call
this gateway sees end takes itself out of the figures it was part of: its prompt's tokens out of
the KV held, itself out of the requests counted, and the KV held shrinks in proportion to the
requests that are left (a call's KV is its prompt rounded up to blocks plus what it generated,
which only the engine knows).

A call counts as part of a figure only when it was dispatched before that figure's GetLoad was
asked: one that started and ended between two polls was never in either.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpgate.v1 import control_pb2


@dataclass(slots=True)
class _Releases:
    """What calls in the current figure have released since it was asked."""

    calls: int = 0
    prompt_tokens: int = 0


class ReportedLoad:
    """The last GetLoad answer of one engine, less the calls this gateway has seen end since."""

    __slots__ = ("_figure_ask", "_num_asks", "_released", "num_running", "num_used_blocks", "num_waiting")

    def __init__(self) -> None:
        self.num_running = 0
        self.num_waiting = 0
        self.num_used_blocks = 0  # KV blocks held by the engine's requests
        self._num_asks = 0  # GetLoad requests sent so far
        self._figure_ask = 0  # the number of the ask whose answer the figures are
        self._released = _Releases()

    @property
    def num_asks(self) -> int:
        """Stamp a call with this at dispatch; hand it back to `released` when the call ends."""
        return self._num_asks

    def asking(self) -> tuple[int, _Releases]:
        """A GetLoad is about to be sent: its number, and the releases so far (which it will see)."""
        self._num_asks += 1
        return self._num_asks, _Releases(self._released.calls, self._released.prompt_tokens)

    def answered(self, ask: int, before: _Releases, response: control_pb2.GetLoadResponse) -> None:
        """Take the answer to ask number `ask`; releases made while it was on its way stay counted
        (the engine may have answered before they happened, and the next poll corrects either way)."""
        if ask < self._figure_ask:  # a later ask was answered first
            return
        self.num_running = response.num_running
        self.num_waiting = response.num_waiting
        self.num_used_blocks = response.num_used_blocks
        self._figure_ask = ask
        self._released.calls -= before.calls
        self._released.prompt_tokens -= before.prompt_tokens

    def released(self, dispatched_at: int, num_prompt_tokens: int = 0) -> None:
        """A call this gateway sent here ended. `dispatched_at` is `num_asks` when it was sent;
        `num_prompt_tokens` is its prompt's length where the gateway tokenized it, else 0."""
        if dispatched_at < self._num_asks:  # asked about while it was open: in this figure or the next
            self._released.calls += 1
            self._released.prompt_tokens += num_prompt_tokens

    @property
    def num_requests(self) -> int:
        """Requests the engine had (running, then waiting) less those seen ending since."""
        return max(0, self.num_running + self.num_waiting - self._released.calls)

    def running_and_waiting(self) -> tuple[int, int]:
        """`num_requests` split as the engine would now: the ended calls were running, and waiting
        requests take their places."""
        running, waiting, _ = self.figures(0)
        return running, waiting

    def kv_tokens(self, block_size: int) -> int:
        """The KV the engine's requests hold, in tokens, as of now (an estimate from below)."""
        return self.figures(block_size)[2]

    def figures(self, block_size: int) -> tuple[int, int, int]:
        """Running and waiting requests and KV tokens as of now (`running_and_waiting`, `kv_tokens`)
        in one call: routing asks for all three of every engine for every call (issue 27)."""
        reported = self.num_running + self.num_waiting
        released = self._released
        left = max(0, reported - released.calls)  # num_requests
        running = min(self.num_running, left)
        held = self.num_used_blocks * block_size
        estimate = held - released.prompt_tokens
        if reported:
            estimate = min(estimate, held * left // reported)
        return running, left - running, max(0, estimate)
