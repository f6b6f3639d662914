"""The dpgate.v1 services of an engine, on grpc.aio.

Handlers translate between the wire and `AsyncEngine`; each error type a request can raise maps
to one status code in `STATUS_FOR_ERROR`, so no client ever sees a Python traceback. Messages
come from our own error classes; a failure of the engine itself, or an exception nobody
expected, gets a fixed message and is logged. Request bodies that are not valid messages never
reach a handler: `dpgate.servicer_guard` refuses them with INVALID_ARGUMENT (server.py installs it).

Each Generate call runs under its `x-request-id` (the gateway's, or a new one: dpgate/request_id.py):
every line it logs carries the id, it ends with one line (logger `dpgate.engine.requests`) giving
its code, token counts and duration, and the id goes back in trailing metadata.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

import grpc

from dpgate.chat.template import ChatTemplate, NoChatTemplateError
from dpgate.logs import request_id_var
from dpgate.request_id import REQUEST_ID_KEY, resolve_request_id
from dpgate.tenant import tenant_from_metadata
from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2, generate_pb2_grpc
from engines.chat.markers import ChatParsing
from engines.chat.output_parser import (
    ChatOutputParser,
    ChatPiece,
    ParsedToolCall,
    collect,
    drop_tool_calls_after,
)
from engines.model.token_texts import TokenTexts
from engines.sampling.params import InvalidRequestError
from engines.sampling.tokens import SampledToken
from engines.scheduling.scheduler import QueueFullError, RequestTooLargeError
from engines.scheduling.sequence import FinishReason, Sequence, StepOutput
from engines.serving.async_engine import AsyncEngine, EngineFailedError
from engines.serving.chat_request import ChatRun, ToolCallsOffError, build_chat, run_here
from engines.serving.kv_watch import watch_kv_events
from engines.serving.metrics import EngineMetrics
from engines.serving.request_builder import (
    ChatLike,
    ModelLimits,
    UnknownModelError,
    UnsupportedFeatureError,
    build_sequence,
)

logger = logging.getLogger(__name__)
request_logger = logging.getLogger("dpgate.engine.requests")


STATUS_FOR_ERROR: dict[type[Exception], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownModelError: grpc.StatusCode.NOT_FOUND,
    UnsupportedFeatureError: grpc.StatusCode.UNIMPLEMENTED,
    QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    RequestTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    EngineFailedError: grpc.StatusCode.INTERNAL,
    NoChatTemplateError: grpc.StatusCode.FAILED_PRECONDITION,
    ToolCallsOffError: grpc.StatusCode.FAILED_PRECONDITION,
}

INTERNAL_MESSAGE = "internal engine error"
ENGINE_FAILED_MESSAGE = "the engine failed while running this request"
# Errors whose text is not ours to send (it comes from wherever the engine thread failed).
_FIXED_MESSAGE: dict[type[Exception], str] = {EngineFailedError: ENGINE_FAILED_MESSAGE}

_WIRE_FINISH = {
    FinishReason.LENGTH: generate_pb2.FINISH_REASON_LENGTH,
    FinishReason.STOP: generate_pb2.FINISH_REASON_STOP,
    FinishReason.ABORTED: generate_pb2.FINISH_REASON_ABORTED,
}


def status_for(error: Exception) -> grpc.StatusCode | None:
    for error_type, code in STATUS_FOR_ERROR.items():
        if isinstance(error, error_type):
            return code
    return None


def invalid_body_counter(metrics: EngineMetrics) -> Callable[[str], None]:
    """Count refused request bodies of the dpgate.v1 methods like any other answer of theirs."""

    def count(method: str) -> None:
        service, _, rpc = method.lstrip("/").rpartition("/")
        if service.startswith("dpgate.v1."):
            metrics.requests.labels(rpc=rpc, code=grpc.StatusCode.INVALID_ARGUMENT.name).inc()

    return count


def request_tenant(context: grpc.aio.ServicerContext) -> str:
    """The tenant the gateway bound the call to (x-dpgate-tenant; "" without one)."""
    return tenant_from_metadata(context.invocation_metadata())


def call_request_id(context: grpc.aio.ServicerContext) -> str:
    """The call's x-request-id, or a new one (logged) when the one sent cannot be used."""
    sent = [value for key, value in context.invocation_metadata() or () if key == REQUEST_ID_KEY]
    request_id, problem = resolve_request_id(sent)
    if problem is not None and sent:
        logger.warning(
            "the call's x-request-id %s; it is replaced by %s", problem, request_id, extra={"request_id": request_id}
        )
    return request_id


def log_request(rpc: str, code: grpc.StatusCode, counts: list[int], arrived: float, data_parallel_rank: int) -> None:
    duration_ms = round((time.perf_counter() - arrived) * 1000, 3)
    num_prompt, num_generated = counts
    request_logger.info(
        "%s %s: %d prompt tokens, %d generated in %.1f ms",
        rpc,
        code.name,
        num_prompt,
        num_generated,
        duration_ms,
        extra={
            "rpc": rpc,
            "code": code.name,
            "data_parallel_rank": data_parallel_rank,
            "duration_ms": duration_ms,
            "num_prompt_tokens": num_prompt,
            "num_generated_tokens": num_generated,
        },
    )


def finish_info(output: StepOutput) -> generate_pb2.FinishInfo:
    info = generate_pb2.FinishInfo(
        reason=_WIRE_FINISH[output.finish_reason],
        num_prompt_tokens=output.num_prompt_tokens,
        num_generated_tokens=output.num_generated_tokens,
        num_cached_prompt_tokens=output.num_cached_tokens,
    )
    if output.stop_string is not None:
        info.stop_string = output.stop_string
    elif output.stop_token_id is not None:
        info.stop_token_id = output.stop_token_id
    return info


def wire_logprobs(output: StepOutput, texts: TokenTexts) -> list[generate_pb2.TokenLogprob]:
    return wire_tokens(output.logprobs, texts)


def wire_tokens(tokens: list[SampledToken], texts: TokenTexts) -> list[generate_pb2.TokenLogprob]:
    """Logprob entries with each token's bytes and text beside its id (OpenAI clients show text)."""
    wired = []
    for sampled in tokens:
        top = [
            generate_pb2.TopLogprob(token_id=t, logprob=lp, token_bytes=texts.token_bytes(t), token=texts.text(t))
            for t, lp in sampled.top_logprobs
        ]
        token_id = sampled.token_id
        wired.append(
            generate_pb2.TokenLogprob(
                token_id=token_id,
                logprob=sampled.logprob,
                top_logprobs=top,
                token_bytes=texts.token_bytes(token_id),
                token=texts.text(token_id),
            )
        )
    return wired


def wire_piece(piece: ChatPiece) -> generate_pb2.ChatDelta:
    """A parsed piece as a delta of its own kind."""
    if piece.kind == "content":
        return generate_pb2.ChatDelta(content=piece.text)
    if piece.kind == "reasoning":
        return generate_pb2.ChatDelta(reasoning_content=piece.text)
    assert piece.tool_call is not None  # a tool_call piece always carries its call
    return generate_pb2.ChatDelta(tool_call=wire_tool_call(piece.tool_call))


def log_dropped_calls(parser: ChatOutputParser) -> None:
    """A tool call the model wrote but that did not parse is dropped from the answer: say so in the log."""
    if parser.num_dropped_calls:
        logger.warning("dropped %d tool call(s) that did not parse or never closed", parser.num_dropped_calls)


def wire_tool_call(call: ParsedToolCall) -> generate_pb2.ToolCall:
    return generate_pb2.ToolCall(id=call.id, name=call.name, arguments=call.arguments)


def _ignoring_event(build: Callable[..., Sequence], *args: object) -> Sequence:
    """A builder that has no grammar work to stop: the cancel event (last argument) is not needed."""
    return build(*args[:-1])


class InferenceServicer(generate_pb2_grpc.InferenceServiceServicer):
    """Generate and Chat share one run path (`_run`): validation, metrics, the request's log line,
    and aborting the request in the engine when the client goes away. `chat_template` is None when
    the model has none and no --chat-template was given: Chat then answers FAILED_PRECONDITION."""

    def __init__(
        self,
        engine: AsyncEngine,
        limits: ModelLimits,
        tokenizer,
        metrics: EngineMetrics,
        data_parallel_rank: int = 0,
        chat_template: ChatTemplate | None = None,
        chat_parsing: ChatParsing | None = None,
    ):
        self.engine = engine
        self.limits = limits
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)
        self.metrics = metrics
        self.data_parallel_rank = data_parallel_rank
        self.chat_template = chat_template
        self.chat_parsing = chat_parsing or ChatParsing()

    async def Generate(self, request: generate_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        response = generate_pb2.GenerateResponse()
        build = functools.partial(
            _ignoring_event, build_sequence, request, self.limits, self.tokenizer, request_tenant(context)
        )
        async for _, output in self._run("Generate", build, context):
            response.request_id = output.request_id
            response.text += output.text
            response.token_ids.extend(output.token_ids)
            response.logprobs.extend(wire_logprobs(output, self.token_texts))
            response.prompt_logprobs.extend(wire_tokens(output.prompt_logprobs, self.token_texts))
            if output.finish_reason is not None:
                response.finish.CopyFrom(finish_info(output))
        return response

    async def GenerateStream(
        self, request: generate_pb2.GenerateStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[generate_pb2.GenerateStreamResponse]:
        first = True
        build = functools.partial(
            _ignoring_event, build_sequence, request, self.limits, self.tokenizer, request_tenant(context)
        )
        async for seq, output in self._run("GenerateStream", build, context):
            if first:
                prompt = generate_pb2.PromptInfo(
                    request_id=seq.request_id,
                    prompt_token_ids=seq.prompt_ids,
                    prompt_logprobs=wire_tokens(output.prompt_logprobs, self.token_texts),
                )
                yield generate_pb2.GenerateStreamResponse(prompt_info=prompt)
                first = False
            if output.text or output.token_ids:
                delta = generate_pb2.Delta(
                    text=output.text, token_ids=output.token_ids, logprobs=wire_logprobs(output, self.token_texts)
                )
                yield generate_pb2.GenerateStreamResponse(delta=delta)
            if output.finish_reason is not None:
                yield generate_pb2.GenerateStreamResponse(finish=finish_info(output))

    def _chat_run(self, request: ChatLike, context: grpc.aio.ServicerContext, cancelled: threading.Event) -> ChatRun:
        if self.chat_template is None:
            raise NoChatTemplateError()
        grammar_work = run_here
        if self.engine.grammars is not None:
            grammar_work = functools.partial(self.engine.grammars.run, cancelled=cancelled)
        tenant = request_tenant(context)
        return build_chat(
            request, self.limits, self.tokenizer, self.chat_template, self.chat_parsing, tenant, grammar_work
        )

    def _parser(self, run: ChatRun) -> ChatOutputParser:
        return ChatOutputParser.for_parsing(run.parsing, run.thinking, request_id=run.sequence.request_id)

    async def Chat(self, request: generate_pb2.ChatRequest, context: grpc.aio.ServicerContext):
        response = generate_pb2.ChatResponse()
        runs: list[ChatRun] = []
        text = ""

        def build(cancelled: threading.Event) -> Sequence:
            runs.append(self._chat_run(request, context, cancelled))
            return runs[0].sequence

        async for _, output in self._run("Chat", build, context):
            response.request_id = output.request_id
            text += output.text
            response.token_ids.extend(output.token_ids)
            response.logprobs.extend(wire_logprobs(output, self.token_texts))
            if output.finish_reason is not None:
                response.finish.CopyFrom(finish_info(output))
        parser = self._parser(runs[0])  # the streaming parser fed once: unary == streaming by construction
        pieces, _ = drop_tool_calls_after([*parser.feed(text), *parser.finish()], 0, runs[0].max_tool_calls)
        log_dropped_calls(parser)
        parsed = collect(pieces)
        response.content = parsed.content
        response.reasoning_content = parsed.reasoning
        response.tool_calls.extend(wire_tool_call(call) for call in parsed.tool_calls)
        return response

    async def ChatStream(
        self, request: generate_pb2.ChatStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[generate_pb2.ChatStreamResponse]:
        runs: list[ChatRun] = []

        def build(cancelled: threading.Event) -> Sequence:
            runs.append(self._chat_run(request, context, cancelled))
            return runs[0].sequence

        parser: ChatOutputParser | None = None
        num_tool_calls = 0
        async for seq, output in self._run("ChatStream", build, context):
            if parser is None:
                parser = self._parser(runs[0])
                prompt = generate_pb2.PromptInfo(request_id=seq.request_id, prompt_token_ids=seq.prompt_ids)
                yield generate_pb2.ChatStreamResponse(prompt_info=prompt)
            pieces = parser.feed(output.text) if output.text else []
            if output.finish_reason is not None:
                pieces.extend(parser.finish())
                log_dropped_calls(parser)
            pieces, num_tool_calls = drop_tool_calls_after(pieces, num_tool_calls, runs[0].max_tool_calls)
            deltas = [wire_piece(piece) for piece in pieces]
            if output.token_ids and not deltas:
                deltas.append(generate_pb2.ChatDelta())  # the step's tokens were only markup (or held back)
            if deltas:
                deltas[0].token_ids.extend(output.token_ids)
                deltas[0].logprobs.extend(wire_logprobs(output, self.token_texts))
            for delta in deltas:
                yield generate_pb2.ChatStreamResponse(delta=delta)
            if output.finish_reason is not None:
                yield generate_pb2.ChatStreamResponse(finish=finish_info(output))

    async def _run(self, rpc: str, build: Callable[[threading.Event], Sequence], context: grpc.aio.ServicerContext):
        """Build (validating, off the event loop), run and yield (sequence, step output); every
        failure becomes one status with a message. `build` gets an event set when the call ends."""
        code = grpc.StatusCode.OK
        arrived = time.perf_counter()
        first_token_at: float | None = None
        counts = [0, 0]  # prompt tokens, generated tokens (for the request's log line)
        request_id = call_request_id(context)
        request_id_var.set(request_id)  # this call's task only: grpc.aio runs each call in its own task
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        try:
            async for seq, output in self.engine.run(build):
                if first_token_at is None and output.token_ids:
                    first_token_at = time.perf_counter()
                    self.metrics.ttft.observe(first_token_at - arrived)
                if output.finish_reason is not None and first_token_at is not None and output.num_generated_tokens > 1:
                    gaps = output.num_generated_tokens - 1
                    self.metrics.tpot.observe((time.perf_counter() - first_token_at) / gaps)
                counts = [output.num_prompt_tokens, output.num_generated_tokens]
                yield seq, output
        except Exception as error:
            code = status_for(error)
            message = _FIXED_MESSAGE.get(type(error))
            if code is None:
                code, message = grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE
            if message is not None:
                logger.exception("%s failed", rpc)
            await context.abort(code, str(error) if message is None else message)
        except BaseException:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            self.metrics.requests.labels(rpc=rpc, code=code.name).inc()
            log_request(rpc, code, counts, arrived, self.data_parallel_rank)


class ControlServicer(control_pb2_grpc.ControlServiceServicer):
    def __init__(
        self,
        engine: AsyncEngine,
        server_info: control_pb2.GetServerInfoResponse,
        model_info: control_pb2.GetModelInfoResponse,
        metrics: EngineMetrics,
        tokenizer: control_pb2.GetTokenizerResponse | None = None,
    ):
        self.engine = engine
        self.server_info = server_info
        self.model_info = model_info
        self.metrics = metrics
        self.tokenizer = tokenizer if tokenizer is not None else control_pb2.GetTokenizerResponse()

    async def GetServerInfo(self, request, context) -> control_pb2.GetServerInfoResponse:
        self.metrics.requests.labels(rpc="GetServerInfo", code="OK").inc()
        return self.server_info

    async def GetModelInfo(self, request, context) -> control_pb2.GetModelInfoResponse:
        self.metrics.requests.labels(rpc="GetModelInfo", code="OK").inc()
        return self.model_info

    async def GetTokenizer(self, request, context) -> control_pb2.GetTokenizerResponse:
        self.metrics.requests.labels(rpc="GetTokenizer", code="OK").inc()
        return self.tokenizer

    async def GetLoad(self, request, context) -> control_pb2.GetLoadResponse:
        self.metrics.requests.labels(rpc="GetLoad", code="OK").inc()
        blocks = self.engine.blocks
        return control_pb2.GetLoadResponse(
            num_running=self.engine.num_running,
            num_waiting=self.engine.num_waiting + self.engine.num_preparing,
            kv_usage=self.engine.kv_usage,
            num_used_blocks=blocks.num_used,
            num_cached_free_blocks=blocks.num_cached_free,
            num_free_blocks=blocks.num_free,
            num_cached_blocks=blocks.num_cached,
            prefix_cache_query_tokens=blocks.num_query_tokens,
            prefix_cache_hit_tokens=blocks.num_hit_tokens,
        )

    async def ResetPrefixCache(self, request, context) -> control_pb2.ResetPrefixCacheResponse:
        self.metrics.requests.labels(rpc="ResetPrefixCache", code="OK").inc()
        return control_pb2.ResetPrefixCacheResponse(num_cleared_blocks=await self.engine.reset_prefix_cache())

    async def WatchKvEvents(self, request, context) -> AsyncIterator[control_pb2.WatchKvEventsResponse]:
        """A snapshot, then every event in order; a new snapshot whenever this subscriber fell behind."""
        self.metrics.requests.labels(rpc="WatchKvEvents", code="OK").inc()
        async for message in watch_kv_events(self.engine.kv_events):
            yield message

    async def Abort(self, request: control_pb2.AbortRequest, context) -> control_pb2.AbortResponse:
        self.metrics.requests.labels(rpc="Abort", code="OK").inc()
        return control_pb2.AbortResponse(aborted_request_ids=self.engine.abort(list(request.request_ids)))
