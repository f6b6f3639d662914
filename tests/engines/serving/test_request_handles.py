"""Outputs reach the call that asked for them, whatever request_id clients pick (issue 22, item 5):
the engine routes by an internal handle per request, so an id reused right after a cancel never
reads the cancelled call's output, and the cancelled request stops running."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engines.engine import LLMEngine
from engines.model.source import resolve_model
from engines.runner.loader import load
from engines.runner.model_runner import ModelRunner
from engines.sampling.params import SamplingParams, StoppingParams
from engines.scheduling.scheduler import SchedulerConfig
from engines.scheduling.sequence import FinishReason, Sequence
from engines.serving.async_engine import AsyncEngine


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load(resolve_model(str(tiny_model_dir)), torch.float32)


def make_sequence(loaded, request_id: str, prompt_ids: list[int], max_tokens: int) -> Sequence:
    return Sequence(
        request_id=request_id,
        prompt_ids=prompt_ids,
        sampling=SamplingParams(temperature=0.0),
        stopping=StoppingParams(max_tokens=max_tokens, ignore_eos=True),
        stop_token_ids=frozenset(),
        decoder=loaded.tokenizer.tokenizer,
    )


async def with_engine(loaded, body):
    engine = LLMEngine(ModelRunner(loaded, 512, num_blocks=128, block_size=16), SchedulerConfig())
    runner = AsyncEngine(engine, asyncio.get_running_loop())
    try:
        return await body(runner)
    finally:
        runner.shutdown()


def test_an_id_reused_right_after_a_cancel_gets_only_its_own_tokens(tiny):
    prompt_a, prompt_b = [1, 50, 60, 70], [1, 900, 901, 902, 903]

    async def body(runner: AsyncEngine):
        alone = [out async for out in runner.generate(make_sequence(tiny, "solo", prompt_b, 12))]
        expected = [t for out in alone for t in out.token_ids]
        for _ in range(12):
            stream_a = runner.generate(make_sequence(tiny, "X", prompt_a, 400))
            for _ in range(3):
                await anext(stream_a)
            await stream_a.aclose()  # the client cancelled: the engine is told to abort "X"
            outputs = [out async for out in runner.generate(make_sequence(tiny, "X", prompt_b, 12))]
            assert outputs[-1].finish_reason is FinishReason.LENGTH, outputs[-1]
            assert [t for out in outputs for t in out.token_ids] == expected
            for _ in range(100):  # the cancelled request left the engine
                if runner.num_running == 0 and not runner.engine.has_work:
                    break
                await asyncio.sleep(0.01)
            assert runner.num_running == 0 and runner.num_waiting == 0

    asyncio.run(with_engine(tiny, body))


def test_control_abort_by_client_id_still_ends_the_live_request(tiny):
    async def body(runner: AsyncEngine):
        stream = runner.generate(make_sequence(tiny, "Y", [1, 2, 3], 400))
        await anext(stream)
        assert runner.is_active("Y")
        assert runner.abort(["Y", "nobody"]) == ["Y"]
        rest = [out async for out in stream]
        assert rest[-1].finish_reason is FinishReason.ABORTED
        assert not runner.is_active("Y")

    asyncio.run(with_engine(tiny, body))


def test_two_live_calls_with_the_same_id_each_get_their_own_tokens(tiny):
    prompt_a, prompt_b = [1, 50, 60, 70], [1, 900, 901, 902, 903]

    async def body(runner: AsyncEngine):
        async def tokens(prompt):
            return [t async for out in runner.generate(make_sequence(tiny, "same", prompt, 10)) for t in out.token_ids]

        alone_a, alone_b = await tokens(prompt_a), await tokens(prompt_b)
        together = await asyncio.gather(tokens(prompt_a), tokens(prompt_b))
        assert together == [alone_a, alone_b]

    asyncio.run(with_engine(tiny, body))
