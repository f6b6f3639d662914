"""Assemble and run one engine: load the model, bind gRPC, serve until SIGTERM or SIGINT.

Start-up order is chosen so every user mistake fails fast and loudly: flags, then the model file,
then the port, and only then the seconds of model loading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dpgate import __version__
from dpgate.host import usable_cores
from dpgate.servicer_guard import ServicerGuard
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2, generate_pb2_grpc
from engines import kernels
from engines.chat.markers import chat_parsing
from engines.chat.template import load_chat_template
from engines.config import ConfigError, EngineConfig, read_template_text
from engines.engine import LLMEngine
from engines.grammar.compiler import GrammarCompiler
from engines.kernels import KernelBuildError
from engines.kernels.cpu import cpu_info
from engines.model.fingerprint import model_fingerprint
from engines.model.numerics import KERNEL_ISAS, Numerics, NumericsError, choose_numerics
from engines.model.source import ModelSource, SourceKind, resolve_model
from engines.runner.thread_choice import ThreadChoice, ThreadSource
from engines.serving.async_engine import AsyncEngine
from engines.serving.engine_lock import EngineLock
from engines.serving.engine_thread import EngineThread
from engines.serving.metrics import EngineMetrics
from engines.serving.request_builder import ModelLimits, max_prompt_chars
from engines.serving.servicers import INTERNAL_MESSAGE, ControlServicer, InferenceServicer, invalid_body_counter
from engines.serving.startup import freeze_startup_heap, start_model
from engines.serving.tokenizer_export import tokenizer_message

logger = logging.getLogger("dpgate.engine")

SERVICE_NAMES = (
    generate_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name,
    control_pb2.DESCRIPTOR.services_by_name["ControlService"].full_name,
)
SHUTDOWN_GRACE_S = 5.0
THREAD_SOURCES = {
    ThreadSource.FLAG: control_pb2.THREAD_SOURCE_FLAG,
    ThreadSource.MEASURED: control_pb2.THREAD_SOURCE_MEASURED,
    ThreadSource.ONE_CPU: control_pb2.THREAD_SOURCE_ONE_CPU,
    ThreadSource.TENSOR_PARALLEL: control_pb2.THREAD_SOURCE_TENSOR_PARALLEL,
}


def numerics_for(config: EngineConfig, source: ModelSource) -> Numerics:
    """The engine's dtype and kernels for this CPU (building the kernel library if it is missing)."""
    isas: tuple[str, ...] = ()
    if config.batch_invariant:
        try:
            isas = kernels.supported_isas()
        except KernelBuildError as error:
            raise ConfigError(f"--batch-invariant: {error}") from error
        isas = capped_isas(isas, config.kernel_isa)
    try:
        gguf = source.kind is SourceKind.GGUF
        numerics = choose_numerics(config.dtype, config.quantization, config.batch_invariant, cpu_info(), isas, gguf)
    except NumericsError as error:
        raise ConfigError(str(error)) from error
    if config.kernel_isa != "auto":
        numerics = dataclasses.replace(numerics, reason=f"{numerics.reason}; --kernel-isa {config.kernel_isa}")
    return numerics


def capped_isas(isas: tuple[str, ...], kernel_isa: str) -> tuple[str, ...]:
    """`isas` (what this CPU runs) less those above `--kernel-isa`; a cap the CPU cannot run is refused
    rather than served by something slower than asked."""
    if kernel_isa == "auto":
        return isas
    if kernel_isa not in isas:
        raise ConfigError(f"--kernel-isa {kernel_isa}: this CPU's kernels run {', '.join(isas)}")
    allowed = KERNEL_ISAS[KERNEL_ISAS.index(kernel_isa) :]
    return tuple(isa for isa in isas if isa in allowed)


def _warm_up_grammars(grammars: GrammarCompiler) -> None:
    try:
        grammars.warm_up()
    except Exception:  # the first grammar will try again, and report what fails then
        logger.exception("starting the grammar compiler failed")


async def serve(config: EngineConfig) -> int:
    started = time.monotonic()
    source = resolve_model(config.model, config.served_model_name)
    metrics = EngineMetrics()
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if config.engine_token is not None:
        interceptors.append(EngineLock(config.engine_token))
    interceptors.append(ServicerGuard(INTERNAL_MESSAGE, invalid_body_counter(metrics)))
    server = grpc.aio.server(interceptors=tuple(interceptors))
    address = f"{config.host}:{config.port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as error:
        raise ConfigError(f"--port {config.port}: cannot bind {address} ({error})") from error

    # Everything that runs torch runs on this one thread, from loading to the last step:
    # engine_thread.py says why a second thread's OpenMP team costs two thirds of the speed.
    engine_thread = EngineThread()
    if config.num_threads is not None:
        await engine_thread.call(_set_threads, config.num_threads)
        if config.num_threads > usable_cores():
            logger.warning(
                "--num-threads %d is more than the %d CPUs this engine may run on: its threads will wait on "
                "each other at every step; give it at most %d",
                config.num_threads, usable_cores(), usable_cores(),
            )  # fmt: skip
    numerics = await engine_thread.call(numerics_for, config, source)
    model = await engine_thread.call(start_model, config, source, numerics)
    loaded, runner, max_model_len, num_blocks = model.loaded, model.runner, model.max_model_len, model.num_blocks
    logger.info("numerics: %s, on %s", numerics.describe(), cpu_info().describe())
    logger.info("threads: %s", model.threads.describe())
    tokenizer = loaded.tokenizer
    grammars = GrammarCompiler(
        tokenizer.tokenizer,
        loaded.config.vocab_size,
        tokenizer.eos_token_ids,
        budget_s=config.grammar_compile_timeout_s,
    )
    plan = loaded.plan
    fingerprint = await asyncio.to_thread(model_fingerprint, source, numerics, plan.dcp_size, plan.interleave)
    core = LLMEngine(runner, config.scheduler_config, config.prefix_caching, fingerprint)
    engine = AsyncEngine(core, asyncio.get_running_loop(), grammars, engine_thread)
    freeze_startup_heap()
    metrics.watch(engine)
    metrics.set_identity(config.data_parallel_rank, config.data_parallel_size, source.name, __version__)
    limits = ModelLimits(
        source.name,
        loaded.config.vocab_size,
        max_model_len,
        tokenizer.eos_token_ids,
        max_stop_strings=config.max_stop_strings,
        max_stop_string_bytes=config.max_stop_string_bytes,
        max_prompt_chars=max_prompt_chars(tokenizer.tokenizer, max_model_len),
    )

    server_info = control_pb2.GetServerInfoResponse(
        version=__version__,
        parallelism=control_pb2.Parallelism(
            data_parallel_rank=config.data_parallel_rank,
            data_parallel_size=config.data_parallel_size,
            tensor_parallel_size=config.tensor_parallel_size,
            decode_context_parallel_size=config.decode_context_parallel_size,
            dcp_kv_interleave=config.dcp_kv_interleave,
        ),
        model=source.name,
        max_model_len=max_model_len,
        kv_block_size=runner.block_size,
        num_kv_blocks=num_blocks,
        kv_capacity_tokens=model.kv_capacity_tokens,
        prefix_caching=config.prefix_caching,
        prefix_cache_root_hash=core.block_manager.root,
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
        **thread_fields(model.threads),
    )
    if tokenizer.bos_token_id is not None:
        model_info.bos_token_id = tokenizer.bos_token_id

    parsing = chat_parsing(
        loaded.config.architecture,
        reasoning_parser=config.reasoning_parser,
        tool_call_parser=config.tool_call_parser,
        reasoning_markers=config.reasoning_markers,
    )
    template_text = read_template_text(config.chat_template) if config.chat_template is not None else None
    chat_template = load_chat_template(tokenizer.tokenizer, parsing.markers, template_text)
    inference = InferenceServicer(
        engine, limits, tokenizer.tokenizer, metrics, config.data_parallel_rank, chat_template, parsing
    )
    generate_pb2_grpc.add_InferenceServiceServicer_to_server(inference, server)
    tokenizer_export = await asyncio.to_thread(tokenizer_message, tokenizer.tokenizer, chat_template)
    server_info.tokenizer_fingerprint = tokenizer_export.fingerprint
    control_pb2_grpc.add_ControlServiceServicer_to_server(
        ControlServicer(engine, server_info, model_info, metrics, tokenizer_export), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if config.metrics_port is not None:
        metrics.serve(config.host, config.metrics_port)

    await server.start()
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    # Once serving (start-up stays as fast as before), off the loop and the engine thread: the
    # grammar workers start, so the first grammar does not wait for xgrammar to load.
    threading.Thread(target=_warm_up_grammars, args=(grammars,), name="dpgate-grammar-warm-up", daemon=True).start()
    if config.engine_token is None:  # said once serving, so a refused flag still prints one sentence
        logger.warning(
            "no engine token (--engine-token-file or $DPGATE_ENGINE_TOKEN): anyone who can reach this port "
            "can call the engine directly, bypassing the gateway's keys and limits"
        )
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
    failures: list[str] = []
    if model.workers is not None:  # a worker that dies or hangs ends the engine, naming its rank
        model.workers.on_failure = lambda reason: loop.call_soon_threadsafe(_fail, failures, reason, stop)
    await stop.wait()
    logger.info("engine shutting down")
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(SHUTDOWN_GRACE_S)
    engine.shutdown()
    grammars.shutdown()
    model.shutdown()
    if failures:
        logger.error("engine stopped: %s", failures[0])
        return 1
    return 0


def thread_fields(choice: ThreadChoice) -> dict:
    """GetModelInfoResponse's fields for the engine's thread choice."""
    trials = [
        control_pb2.ThreadTrial(num_threads=t.num_threads, one_row_step_ms=t.one_row_ms, batch_step_ms=t.batch_ms,
                                batch_rows=choice.batch_rows)
        for t in choice.trials
    ]  # fmt: skip
    return {
        "num_threads": choice.num_threads,
        "thread_source": THREAD_SOURCES[choice.source],
        "usable_cpus": choice.usable_cpus,
        "omp_wait_policy": choice.wait_policy,
        "thread_trials": trials,
    }


def _set_threads(num_threads: int) -> None:
    import torch

    torch.set_num_threads(num_threads)


def _fail(failures: list[str], reason: str, stop: asyncio.Event) -> None:
    failures.append(reason)
    stop.set()
