"""How many leading blocks of a chain each engine holds: the walk the exact index and the in-flight
prefixes share. Pure data.

An engine takes only a prefix of consecutive cached blocks, so the walk drops an engine at its
first missing block and stops when none is left. It runs for every routed call over every block
of the prompt (62 for 1,000 tokens in 16-token blocks), usually with one to a few engines alive
that hold every block, so a step that drops no one allocates nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def leading_blocks(chain: Sequence[int], holders: Mapping[int, Collection[str]]) -> dict[str, int]:
    """address -> leading blocks of `chain` it holds, for each holder of the first block."""
    matched: dict[str, int] = {}
    alive: list[str] = []
    depth = 0
    for depth, block_hash in enumerate(chain):  # depth is read after the loop
        held = holders.get(block_hash)
        if not held:
            break
        if depth == 0:
            alive = list(held)
            continue
        for address in alive:  # a plain loop: no generator or set made for the usual step
            if address not in held:
                break
        else:
            continue
        for address in alive:
            if address not in held:
                matched[address] = depth
        alive = [address for address in alive if address in held]
        if not alive:
            break
    else:
        depth = len(chain)
    for address in alive:
        matched[address] = depth
    return matched
