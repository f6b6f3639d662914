"""The leading-blocks walk against its definition, counted engine by engine, on random holdings."""

from __future__ import annotations

import random

from gateway.routing.leading_blocks import leading_blocks


def by_definition(chain: list[int], holders: dict[int, set[str]]) -> dict[str, int]:
    matched = {}
    for address in set().union(*holders.values()) if holders else set():
        depth = 0
        while depth < len(chain) and address in holders.get(chain[depth], ()):
            depth += 1
        if depth:
            matched[address] = depth
    return matched


def test_random_chains_and_holdings_match_the_definition():
    rng = random.Random(4)
    for _ in range(2_000):
        chain = [rng.randrange(12) for _ in range(rng.randrange(0, 10))]
        holders = {block: {a for a in "abcd" if rng.random() < 0.7} for block in range(12) if rng.random() < 0.8}
        as_dicts = {block: dict.fromkeys(held, 1) for block, held in holders.items()}  # the in-flight shape
        expected = by_definition(chain, holders)
        assert leading_blocks(chain, holders) == expected == leading_blocks(chain, as_dicts), (chain, holders)
