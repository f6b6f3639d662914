"""The gateway's block chain against the engine's own hash function (engines/kv/prefix_hash.py):
the same hashes for random prompts, salts and tenants, and only the blocks an engine can take."""

from __future__ import annotations

import random
from array import array

from engines.kv.prefix_hash import block_hash, extra_keys, root_hash
from gateway.routing.block_hashes import block_chain


def engine_chain(tokens: list[int], root: int, size: int, tenant: str, salt: str) -> list[int]:
    extra, parent, chain = extra_keys(tenant, salt), root, []
    for start in range(0, (len(tokens) - 1) // size * size, size):
        parent = block_hash(parent, extra, tokens[start : start + size])
        chain.append(parent)
    return chain


def test_the_chain_equals_the_engines_for_random_prompts_salts_and_tenants():
    rng = random.Random(5)
    root = root_hash(b"some model fingerprint")
    for _ in range(200):
        tokens = [rng.randrange(262144) for _ in range(rng.randrange(0, 100))]
        tenant = rng.choice(["", "key-abc", "ü"])
        salt = rng.choice(["", "s", "salt with spaces", "東京"])
        expected = engine_chain(tokens, root, 16, tenant, salt)
        assert block_chain(tokens, root, 16, tenant, salt) == expected
        assert block_chain(array("I", tokens), root, 16, tenant, salt) == expected  # the tokenizer's ids


def test_the_block_holding_the_last_prompt_token_is_never_in_the_chain():
    root = root_hash(b"f")
    assert len(block_chain(list(range(16)), root, 16)) == 0
    assert len(block_chain(list(range(17)), root, 16)) == 1
    assert len(block_chain(list(range(33)), root, 16)) == 2
    assert block_chain(list(range(40)), root, 16, "a", "b") != block_chain(list(range(40)), root, 16, "ab", "")
