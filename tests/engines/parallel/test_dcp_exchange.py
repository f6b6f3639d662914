"""The DCP exchange across real processes: epoch-parity slots in shared memory never mix epochs,
even with one rank slowed at random for 200 consecutive steps, and rows without keys are never
read (their slots are poisoned with NaN before every publish)."""

from __future__ import annotations

import multiprocessing
import random
import time

import pytest
import torch

from engines.parallel.dcp_exchange import DcpExchange, ExchangeTimeout, exchange_specs
from engines.parallel.shm import SharedArena

HEADS, HEAD_DIM, TOKENS = 2, 16, 8


def step_data(epoch: int, rank: int, dcp_size: int):
    """What rank `rank` publishes at step `epoch`: queries, partial outputs and LSEs, all derived
    from (epoch, rank), so any rank can compute what every other rank should have sent. Rows below
    `rank` have no keys on that rank (LSE -inf), as early positions of a sharded prompt."""
    generator = torch.Generator().manual_seed(epoch * 100 + rank)
    q = torch.randn(TOKENS, HEADS, HEAD_DIM, generator=generator)
    out = torch.randn(TOKENS, dcp_size * HEADS, HEAD_DIM, generator=generator)
    lse = torch.randn(TOKENS, dcp_size * HEADS, generator=generator)
    lse[:rank] = float("-inf")
    return q, out, lse


def expected_combined(epoch: int, rank: int, dcp_size: int) -> torch.Tensor:
    parts = [step_data(epoch, r, dcp_size) for r in range(dcp_size)]
    mine = slice(rank * HEADS, (rank + 1) * HEADS)
    lses = torch.stack([lse[:, mine] for _, _, lse in parts]).double()
    outs = torch.stack([torch.nan_to_num(out[:, mine], nan=0.0) for _, out, _ in parts]).double()
    weights = torch.softmax(lses, dim=0).nan_to_num(0.0)
    return (weights[..., None] * outs).sum(0)


def run_rank(name: str, dcp_size: int, rank: int, steps: int, slow_rank: int, errors) -> None:
    try:
        arena = SharedArena(exchange_specs(dcp_size, TOKENS, HEADS, HEAD_DIM), name=name)
        exchange = DcpExchange(arena, dcp_size, rank, timeout_s=30)
        rng = random.Random(rank)
        for step in range(1, steps + 1):
            if rank == slow_rank:
                time.sleep(rng.random() * 0.004)
            q, out, lse = step_data(step, rank, dcp_size)
            gathered = exchange.gather_queries(q)
            expected_q = torch.cat([step_data(step, r, dcp_size)[0] for r in range(dcp_size)], dim=1)
            assert torch.equal(gathered, expected_q), f"rank {rank} step {step}: queries of another epoch"
            combined = exchange.combine_partials(out, lse, "scalar")
            expected = expected_combined(step, rank, dcp_size)
            assert torch.isfinite(combined).all(), f"rank {rank} step {step}: read a slot it must not"
            assert torch.allclose(combined.double(), expected, atol=1e-5), f"rank {rank} step {step}: mixed epochs"
            # Poison this rank's own rows that carried no payload, as a stale slot would be.
            slot = exchange.epoch & 1
            exchange.outputs[slot, rank, :rank] = float("nan")
    except Exception as error:  # reported to the test process
        errors.put(f"{type(error).__name__}: {error}")


@pytest.mark.parametrize("dcp_size", [2, 3])
def test_two_hundred_steps_with_a_slow_rank_never_mix_epochs(dcp_size):
    arena = SharedArena(exchange_specs(dcp_size, TOKENS, HEADS, HEAD_DIM))
    for name in ("outputs", "lses", "queries"):
        arena.tensors[name].fill_(float("nan"))
    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    processes = [
        context.Process(target=run_rank, args=(arena.name, dcp_size, rank, 200, dcp_size - 1, errors))
        for rank in range(dcp_size)
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(120)
        assert all(p.exitcode == 0 for p in processes), [p.exitcode for p in processes]
        assert errors.empty(), errors.get()
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        arena.unlink()


def test_a_peer_that_never_publishes_is_named_after_the_timeout():
    arena = SharedArena(exchange_specs(2, TOKENS, HEADS, HEAD_DIM))
    try:
        exchange = DcpExchange(arena, 2, 0, timeout_s=0.2)
        with pytest.raises(ExchangeTimeout, match="decode context parallel rank 1 did not publish its queries"):
            exchange.gather_queries(torch.zeros(TOKENS, HEADS, HEAD_DIM))
    finally:
        arena.unlink()
