"""Bring an engine's model up: load it (with tensor parallelism, every rank its share, in
parallel), size its KV cache, warm it up. The gRPC server (engines/serving/server.py) calls
`start_model` once and serves what it returns.

Sizes come from the model's config, read before any weight: the context length, and the KV
blocks `--kv-cache-memory-mb` holds on each rank (with decode context parallelism a block holds
`block_size` positions on each of the C ranks, so the same memory per rank holds C times the
context). Workers need them before rank 0 has loaded anything, since all ranks load at once.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from dpgate.host import usable_cores
from engines.config import ConfigError, EngineConfig
from engines.model.config import ModelConfig, read_model_config
from engines.model.numerics import Numerics
from engines.model.source import ModelSource
from engines.parallel.plan import ParallelConfigError, ParallelPlan
from engines.parallel.rank import buffer_sizes
from engines.runner.loader import LoadedModel, load_for_serving
from engines.runner.model_runner import ChunkInput, ModelRunner
from engines.runner.thread_choice import ThreadChoice, ThreadSource, candidates, measure_threads, pick
from engines.runner.workers import WorkerGroup, load_rank


@dataclass(slots=True)
class StartedModel:
    loaded: LoadedModel
    runner: ModelRunner
    max_model_len: int
    num_blocks: int
    workers: WorkerGroup | None  # the TP workers, with tensor parallelism
    threads: ThreadChoice

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.runner.block_size

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()


def max_model_len_for(config: EngineConfig, model: ModelConfig) -> int:
    model_max = model.max_position_embeddings
    if config.max_model_len is None:
        return model_max
    if config.max_model_len > model_max:
        raise ConfigError(f"--max-model-len {config.max_model_len} must be <= the model's context of {model_max}")
    return config.max_model_len


def kv_blocks_for_memory(config: EngineConfig, model: ModelConfig, plan: ParallelPlan, numerics: Numerics) -> int:
    """As many blocks as --kv-cache-memory-mb holds on one rank: keys and values of every layer."""
    bytes_per_block = 2 * model.num_layers * config.block_size * plan.kv_heads(model) * model.head_dim
    bytes_per_block *= numerics.torch_dtype.itemsize
    return max(1, config.kv_cache_memory_mb * 2**20 // bytes_per_block)


def threads_per_rank(config: EngineConfig) -> int:
    """The engine's threads (--num-threads, else every CPU it may run on) shared out among its TP ranks."""
    return max(1, (config.num_threads or usable_cores()) // config.tensor_parallel_size)


def freeze_startup_heap() -> None:
    """Move what is alive once the engine has started (model, tokenizer, grammar compiler) out of
    the cyclic collector's generations, as it lives as long as the process: the collector's passes
    then walk only what requests create, not the whole start-up heap again (before this, the
    collector took about 4% of a batch-1 decode step, perf on the 2-vCPU EPYC VM)."""
    gc.collect()
    gc.freeze()


def start_model(config: EngineConfig, source: ModelSource, numerics: Numerics) -> StartedModel:
    """Load, size and warm up the model (blocking: run it off the event loop)."""
    plan = config.parallel_plan
    model = read_model_config(source)
    try:
        plan.check_model(model)
    except ParallelConfigError as error:
        raise ConfigError(str(error)) from error
    max_model_len = max_model_len_for(config, model)
    num_blocks = config.num_kv_blocks or kv_blocks_for_memory(config, model, plan, numerics)
    workers = None
    if not plan.is_parallel:
        loaded = load_for_serving(source, numerics)
        runner = ModelRunner(loaded, max_model_len, num_blocks, config.block_size)
    else:
        import torch

        torch.set_num_threads(threads_per_rank(config))
        # A step holds at most the token budget; warm-up's widest step may hold two tokens more
        # when the budget is tinier than a prefill chunk (ModelRunner.warm_up).
        max_tokens = max(config.max_num_batched_tokens, config.max_num_seqs) + 2
        sizes = buffer_sizes(plan, model, max_tokens, config.max_num_seqs, num_blocks, config.block_size)
        workers = WorkerGroup(plan, source, numerics, max_model_len, num_blocks, config.block_size, sizes,
                              threads_per_rank(config), config.worker_step_timeout)  # fmt: skip
        try:
            loaded = load_rank(source, numerics, plan, 0, workers.group, with_tokenizer=True)
            runner = ModelRunner(loaded, max_model_len, num_blocks, config.block_size, parallel=workers.context)
            workers.ready()
        except BaseException:
            workers.kill()
            raise
    runner.warm_up(config.max_num_seqs, config.max_num_batched_tokens)
    threads = choose_threads(config, runner)
    return StartedModel(loaded, runner, max_model_len, num_blocks, workers, threads)


TRIAL_CONTEXT = 128  # the decode position the thread trial steps at (a short chat's depth)
TRIAL_BATCH_ROWS = 16  # its wide step: 16 decodes, the concurrency the benchmarks serve


def choose_threads(config: EngineConfig, runner: ModelRunner) -> ThreadChoice:
    """The engine's torch threads (runner/thread_choice.py says why they are measured), set on the
    calling thread, which must be the one that steps the engine (engines/serving/engine_thread.py)."""
    import torch

    cpus = usable_cores()
    if config.parallel_plan.is_parallel:  # every rank's share is set when the workers start
        return ThreadChoice(threads_per_rank(config), ThreadSource.TENSOR_PARALLEL, cpus)
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
        return ThreadChoice(config.num_threads, ThreadSource.FLAG, cpus)
    if cpus == 1:
        torch.set_num_threads(1)
        return ThreadChoice(1, ThreadSource.ONE_CPU, cpus)
    table = range(runner.num_blocks)
    position = min(TRIAL_CONTEXT, runner.max_model_len, runner.num_blocks * runner.block_size) - 1
    rows = max(1, min(TRIAL_BATCH_ROWS, config.max_num_seqs))
    one_row = [ChunkInput([0], position, table)]
    batch = [ChunkInput([0], position, table) for _ in range(rows)]
    trials = measure_threads(lambda: runner.execute(one_row), lambda: runner.execute(batch), candidates(cpus))
    chosen = pick(trials)
    torch.set_num_threads(chosen.num_threads)
    return ThreadChoice(chosen.num_threads, ThreadSource.MEASURED, cpus, rows, tuple(trials))
