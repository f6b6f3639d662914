"""Finding a request's stop strings in its growing output text at O(new text) per step.

An Aho-Corasick automaton over the request's stop strings, fed each step's new characters. Its
state is the longest suffix of the text so far that is a prefix of some stop string, so it gives
both answers the sequence needs: whether a stop string has just ended, and how much text to hold
back from the stream (it may still become a stop string). Each character costs amortised O(1)
whatever the number or length of the stop strings, where scanning every stop string against the
text's tail each step cost O(stop bytes x stop length) and let one request with 100,000 stop
strings slow every request beside it (issue 22). Pure data: no torch.
"""

from __future__ import annotations

from collections import deque


class StopScanner:
    """One request's stop strings as an automaton; `feed` it the output text in order."""

    __slots__ = ("_depth", "_ends", "_fail", "_goto", "_hold", "_lengths", "state")

    def __init__(self, stops: tuple[str, ...]):
        self._goto: list[dict[str, int]] = [{}]  # node -> char -> node (the trie)
        self._fail: list[int] = [0]  # node -> the node of its longest proper suffix in the trie
        self._depth: list[int] = [0]  # node -> length of the text it stands for
        self._ends: list[tuple[int, ...]] = [()]  # node -> stops ending here or on its fail chain
        self._hold: list[int] = []  # node -> its longest suffix that is a proper prefix of a stop
        self._lengths = [len(stop) for stop in stops]
        for index, stop in enumerate(stops):
            node = 0
            for char in stop:
                child = self._goto[node].get(char)
                if child is None:
                    child = len(self._goto)
                    self._goto.append({})
                    self._fail.append(0)
                    self._depth.append(self._depth[node] + 1)
                    self._ends.append(())
                    self._goto[node][char] = child
                node = child
            self._ends[node] += (index,)
        self._link()
        self.state = 0

    def _link(self) -> None:
        """Failure links and hold lengths, breadth first (a node's link is shallower, so known)."""
        self._hold = [0] * len(self._goto)
        queue = deque(self._goto[0].values())
        while queue:
            node = queue.popleft()
            # A node with children is a proper prefix of a stop string; a leaf (a whole stop string,
            # reached before min_tokens) holds only what its shorter suffixes could still become.
            self._hold[node] = self._depth[node] if self._goto[node] else self._hold[self._fail[node]]
            for char, child in self._goto[node].items():
                link = self._fail[node]
                while link and char not in self._goto[link]:
                    link = self._fail[link]
                target = self._goto[link].get(char, 0)
                self._fail[child] = target if target != child else 0
                self._ends[child] += self._ends[self._fail[child]]
                queue.append(child)

    @property
    def held(self) -> int:
        """Characters at the end of the text fed so far that could still begin a stop string."""
        return self._hold[self.state]

    def feed(self, text: str, offset: int, report: bool = True) -> tuple[int, int] | None:
        """Advance over `text`, whose first character is at `offset` in the output text. Returns the
        match that ends first within `text` as (start offset, stop index), the longest (earliest
        starting) one when several end at the same character; None when none does or `report` is
        False (before min_tokens: matches are skipped, the state still advances)."""
        goto, fail, ends = self._goto, self._fail, self._ends
        state = self.state
        for position, char in enumerate(text):
            while state and char not in goto[state]:
                state = fail[state]
            state = goto[state].get(char, 0)
            if report and ends[state]:
                index = max(ends[state], key=self._lengths.__getitem__)
                self.state = state
                return offset + position + 1 - self._lengths[index], index
        self.state = state
        return None
