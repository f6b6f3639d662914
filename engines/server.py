"""Assemble and run one engine: load the model, bind gRPC, serve until SIGTERM or SIGINT.

Start-up order is chosen so every user mistake fails fast and loudly: flags, then the model file,
then the port, and only then the seconds of model loading.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dpgate import __version__
from dpgate.servicer_guard import ServicerGuard
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2, generate_pb2_grpc
from engines import kernels
from engines.async_engine import AsyncEngine
from engines.config import ConfigError, EngineConfig
from engines.cpu import cpu_info
from engines.engine import LLMEngine
from engines.grammar.compiler import GrammarCompiler
from engines.kernels import KernelBuildError
from engines.loader import LoadedModel, load_for_serving
from engines.metrics import EngineMetrics
from engines.model_runner import ModelRunner
from engines.model_source import resolve_model
from engines.numerics import Numerics, NumericsError, choose_numerics
from engines.request_builder import ModelLimits
from engines.servicers import INTERNAL_MESSAGE, ControlServicer, InferenceServicer, invalid_body_counter

logger = logging.getLogger("dpgate.engine")

SERVICE_NAMES = (
    generate_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name,
    control_pb2.DESCRIPTOR.services_by_name["ControlService"].full_name,
)
SHUTDOWN_GRACE_S = 5.0


def max_model_len_for(config: EngineConfig, loaded: LoadedModel) -> int:
    model_max = loaded.config.max_position_embeddings
    if config.max_model_len is None:
        return model_max
    if config.max_model_len > model_max:
        raise ConfigError(f"--max-model-len {config.max_model_len} must be <= the model's context of {model_max}")
    return config.max_model_len


def kv_blocks_for_memory(config: EngineConfig, loaded: LoadedModel) -> int:
    """As many blocks as --kv-cache-memory-mb holds: keys and values of every layer."""
    model = loaded.config
    bytes_per_block = 2 * model.num_layers * config.block_size * model.num_kv_heads * model.head_dim
    bytes_per_block *= loaded.model.embed_tokens.weight.element_size()
    return max(1, config.kv_cache_memory_mb * 2**20 // bytes_per_block)


def numerics_for(config: EngineConfig) -> Numerics:
    """The engine's dtype and kernels for this CPU (building the kernel library if it is missing)."""
    isas: tuple[str, ...] = ()
    if config.batch_invariant:
        try:
            isas = kernels.supported_isas()
        except KernelBuildError as error:
            raise ConfigError(f"--batch-invariant: {error}") from error
    try:
        return choose_numerics(config.dtype, config.quantization, config.batch_invariant, cpu_info(), isas)
    except NumericsError as error:
        raise ConfigError(str(error)) from error


async def serve(config: EngineConfig) -> int:
    started = time.monotonic()
    source = resolve_model(config.model, config.served_model_name)
    metrics = EngineMetrics()
    server = grpc.aio.server(interceptors=(ServicerGuard(INTERNAL_MESSAGE, invalid_body_counter(metrics)),))
    address = f"{config.host}:{config.port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as error:
        raise ConfigError(f"--port {config.port}: cannot bind {address} ({error})") from error

    if config.num_threads is not None:
        import torch

        torch.set_num_threads(config.num_threads)
    numerics = await asyncio.to_thread(numerics_for, config)
    loaded = await asyncio.to_thread(load_for_serving, source, numerics)
    logger.info("numerics: %s, on %s", numerics.describe(), cpu_info().describe())
    max_model_len = max_model_len_for(config, loaded)
    num_blocks = config.num_kv_blocks or kv_blocks_for_memory(config, loaded)
    runner = ModelRunner(loaded, max_model_len, num_blocks, config.block_size)
    await asyncio.to_thread(runner.warm_up, config.max_num_seqs, config.max_num_batched_tokens)
    tokenizer = loaded.tokenizer
    grammars = GrammarCompiler(tokenizer.tokenizer, loaded.config.vocab_size, tokenizer.eos_token_ids)
    engine = AsyncEngine(LLMEngine(runner, config.scheduler_config), asyncio.get_running_loop(), grammars)
    metrics.watch(engine)
    limits = ModelLimits(source.name, loaded.config.vocab_size, max_model_len, tokenizer.eos_token_ids)

    server_info = control_pb2.GetServerInfoResponse(
        version=__version__,
        parallelism=control_pb2.Parallelism(
            data_parallel_rank=config.data_parallel_rank,
            data_parallel_size=config.data_parallel_size,
            tensor_parallel_size=1,
            decode_context_parallel_size=1,
        ),
        model=source.name,
        max_model_len=max_model_len,
        kv_block_size=config.block_size,
        num_kv_blocks=num_blocks,
    )
    model_info = control_pb2.GetModelInfoResponse(
        model=source.name,
        architecture=loaded.config.architecture,
        vocab_size=loaded.config.vocab_size,
        max_model_len=max_model_len,
        eos_token_ids=sorted(tokenizer.eos_token_ids),
        dtype=numerics.dtype,
        quantization=numerics.quantization,
        kernels=numerics.kernels,
        batch_invariant=numerics.batch_invariant,
        cpu=cpu_info().describe(),
    )
    if tokenizer.bos_token_id is not None:
        model_info.bos_token_id = tokenizer.bos_token_id

    generate_pb2_grpc.add_InferenceServiceServicer_to_server(
        InferenceServicer(engine, limits, tokenizer.tokenizer, metrics), server
    )
    control_pb2_grpc.add_ControlServiceServicer_to_server(
        ControlServicer(engine, server_info, model_info, metrics), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if config.metrics_port is not None:
        metrics.serve(config.host, config.metrics_port)

    await server.start()
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    logger.info(
        "engine rank %d/%d serving %s on %s (%s, %s weights, max_model_len %d, %d KV blocks of %d) after %.1f s",
        config.data_parallel_rank,
        config.data_parallel_size,
        source.name,
        address,
        numerics.dtype,
        numerics.quantization,
        max_model_len,
        num_blocks,
        config.block_size,
        time.monotonic() - started,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    logger.info("engine shutting down")
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(SHUTDOWN_GRACE_S)
    engine.shutdown()
    grammars.shutdown()
    return 0
