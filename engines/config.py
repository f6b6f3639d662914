"""EngineConfig: every engine flag, read once and validated as a whole before anything starts.

A bad value ends start-up with exit status 2 and one sentence naming the flag and the rule.
"""

from __future__ import annotations

import argparse
import re
import socket
from dataclasses import dataclass, field

from dpgate.engine_token import EngineTokenError, read_engine_token
from dpgate.host import usable_cores
from dpgate.logs import LOG_FORMATS, add_log_format_argument
from engines.grammar.limits import DEFAULT_COMPILE_BUDGET_S
from engines.model.numerics import AUTO_DTYPE, KERNEL_ISAS
from engines.model.source import DEFAULT_MODEL
from engines.parallel.plan import ParallelConfigError, ParallelPlan
from engines.sampling.params import DEFAULT_MAX_STOP_STRING_BYTES, DEFAULT_MAX_STOP_STRINGS
from engines.scheduling.scheduler import SchedulerConfig

# Names only: flags are checked before torch is imported, so a bad flag fails in milliseconds.
DTYPES = (AUTO_DTYPE, "bfloat16", "float16", "float32")
# see engines/model/quantization.py, engines/kernels/gguf_blocks.py and engines/kernels/csrc/int_linear.h
QUANTIZATIONS = ("auto", "none", "int8", "gguf", "int-dot")
# --kernel-isa: "auto" serves the fastest instruction set that passes its start-up self-check.
KERNEL_ISA_CHOICES = ("auto", *KERNEL_ISAS)
DEFAULT_PORT = 50051
# A StatefulSet pod's hostname is `<statefulset name>-<ordinal>`; the ordinal is the DP rank.
_HOSTNAME_ORDINAL = re.compile(r"-(0|[1-9][0-9]*)$")


class ConfigError(ValueError):
    """One sentence naming the flag and the rule it breaks."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = DEFAULT_MODEL
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    dtype: str = AUTO_DTYPE
    max_model_len: int | None = None
    data_parallel_rank: int = 0
    data_parallel_size: int = 1
    metrics_port: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_mb: int = 512
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    step_tokens_after_a_finished_prompt: int = 128
    max_waiting: int = 256
    max_stop_strings: int = DEFAULT_MAX_STOP_STRINGS
    max_stop_string_bytes: int = DEFAULT_MAX_STOP_STRING_BYTES
    grammar_compile_timeout_s: float = DEFAULT_COMPILE_BUDGET_S
    num_threads: int | None = None
    quantization: str = "auto"
    batch_invariant: bool = True
    kernel_isa: str = "auto"
    prefix_caching: bool = True
    tensor_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    dcp_kv_interleave: int = 1
    allow_oversubscribe: bool = False
    worker_step_timeout: float = 30.0
    log_format: str = "plain"  # dpgate.logs.LOG_FORMATS
    chat_template: str | None = None  # a file replacing the model's chat template
    reasoning_parser: str | None = None  # None: the model's default (engines/chat/markers.py)
    tool_call_parser: str | None = None
    reasoning_markers: str | None = None  # "START,END"
    # dpgate/engine_token.py: with a token, calls other than health must carry it. Out of repr.
    engine_token: str | None = field(default=None, repr=False)

    @property
    def parallel_plan(self) -> ParallelPlan:
        return ParallelPlan(self.tensor_parallel_size, self.decode_context_parallel_size, self.dcp_kv_interleave)

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            self.max_num_seqs, self.max_num_batched_tokens, self.max_waiting, self.step_tokens_after_a_finished_prompt
        )

    def validate(self) -> None:
        _check_port("--port", self.port)
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format {self.log_format} must be one of {', '.join(LOG_FORMATS)}")
        if self.metrics_port is not None:
            _check_port("--metrics-port", self.metrics_port)
            if self.metrics_port == self.port:
                raise ConfigError(f"--metrics-port {self.metrics_port} must differ from --port")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype} must be one of {', '.join(DTYPES)}")
        if self.dtype == "float16" and self.batch_invariant:
            raise ConfigError(
                "--dtype float16 is not supported by the batch-invariant kernels; add --no-batch-invariant"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"--max-model-len {self.max_model_len} must be >= 2")
        if self.data_parallel_size < 1:
            raise ConfigError(f"--data-parallel-size {self.data_parallel_size} must be >= 1")
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ConfigError(
                f"--data-parallel-rank {self.data_parallel_rank} must be in [0, {self.data_parallel_size - 1}] "
                f"for --data-parallel-size {self.data_parallel_size}"
            )
        if not self.host:
            raise ConfigError("--host must not be empty")
        if not 1 <= self.block_size <= 1024:
            raise ConfigError(f"--block-size {self.block_size} must be in [1, 1024]")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"--num-kv-blocks {self.num_kv_blocks} must be >= 1")
        if self.kv_cache_memory_mb < 1:
            raise ConfigError(f"--kv-cache-memory-mb {self.kv_cache_memory_mb} must be >= 1")
        if self.max_num_seqs < 1:
            raise ConfigError(f"--max-num-seqs {self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"--max-num-batched-tokens {self.max_num_batched_tokens} must be >= 1")
        if self.step_tokens_after_a_finished_prompt < 1:
            raise ConfigError(
                f"--step-tokens-after-a-finished-prompt {self.step_tokens_after_a_finished_prompt} must be >= 1"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"--quantization {self.quantization} must be one of {', '.join(QUANTIZATIONS)}")
        if self.quantization == "int-dot" and not self.batch_invariant:
            raise ConfigError("--quantization int-dot needs the batch-invariant kernels; drop --no-batch-invariant")
        if self.kernel_isa not in KERNEL_ISA_CHOICES:
            raise ConfigError(f"--kernel-isa {self.kernel_isa} must be one of {', '.join(KERNEL_ISA_CHOICES)}")
        if self.kernel_isa != "auto" and not self.batch_invariant:
            raise ConfigError("--kernel-isa names a batch-invariant kernel; drop --no-batch-invariant")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"--num-threads {self.num_threads} must be >= 1")
        if self.max_waiting < 0:
            raise ConfigError(f"--max-waiting {self.max_waiting} must be >= 0")
        if self.max_stop_strings < 0:
            raise ConfigError(f"--max-stop-strings {self.max_stop_strings} must be >= 0")
        if not self.grammar_compile_timeout_s > 0:
            raise ConfigError(f"--grammar-compile-timeout-s {self.grammar_compile_timeout_s} must be > 0")
        if self.max_stop_string_bytes < 0:
            raise ConfigError(f"--max-stop-string-bytes {self.max_stop_string_bytes} must be >= 0")
        try:
            cores = self.num_threads or usable_cores()
            self.parallel_plan.check_flags(self.block_size, cores, self.allow_oversubscribe)
        except ParallelConfigError as error:
            raise ConfigError(str(error)) from error
        if not self.worker_step_timeout > 0:
            raise ConfigError(f"--worker-step-timeout {self.worker_step_timeout} must be > 0")
        self._validate_chat()
        if self.decode_context_parallel_size > 1 and not self.batch_invariant:
            raise ConfigError(
                "--decode-context-parallel-size above 1 needs the batch-invariant kernels; drop --no-batch-invariant"
            )

    def _validate_chat(self) -> None:
        from engines.chat.markers import MarkerConfigError, chat_parsing

        if self.chat_template is not None:
            try:
                read_template_text(self.chat_template)
            except (OSError, UnicodeDecodeError) as error:
                reason = error.strerror if isinstance(error, OSError) and error.strerror else "not UTF-8 text"
                raise ConfigError(f"--chat-template {self.chat_template} cannot be read ({reason})") from None
        try:  # the names and markers only: the model's own defaults are not known before it loads
            chat_parsing(
                "",
                reasoning_parser=self.reasoning_parser,
                tool_call_parser=self.tool_call_parser,
                reasoning_markers=self.reasoning_markers,
            )
        except MarkerConfigError as error:
            raise ConfigError(str(error)) from None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        """Build the config from parsed flags; raises ConfigError when the DP rank cannot be known."""
        return cls(
            model=args.model,
            served_model_name=args.served_model_name,
            host=args.host,
            port=args.port,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            data_parallel_rank=_data_parallel_rank(args),
            data_parallel_size=args.data_parallel_size,
            metrics_port=args.metrics_port,
            block_size=args.block_size,
            num_kv_blocks=args.num_kv_blocks,
            kv_cache_memory_mb=args.kv_cache_memory_mb,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            step_tokens_after_a_finished_prompt=args.step_tokens_after_a_finished_prompt,
            max_waiting=args.max_waiting,
            max_stop_strings=args.max_stop_strings,
            max_stop_string_bytes=args.max_stop_string_bytes,
            grammar_compile_timeout_s=args.grammar_compile_timeout_s,
            num_threads=args.num_threads,
            quantization=args.quantization,
            batch_invariant=args.batch_invariant,
            kernel_isa=args.kernel_isa,
            prefix_caching=args.prefix_caching,
            tensor_parallel_size=args.tensor_parallel_size,
            decode_context_parallel_size=args.decode_context_parallel_size,
            dcp_kv_interleave=args.dcp_kv_interleave,
            allow_oversubscribe=args.allow_oversubscribe,
            worker_step_timeout=args.worker_step_timeout,
            log_format=args.log_format,
            chat_template=args.chat_template,
            reasoning_parser=args.reasoning_parser,
            tool_call_parser=args.tool_call_parser,
            reasoning_markers=args.reasoning_markers,
            engine_token=_engine_token(args),
        )


def _engine_token(args: argparse.Namespace) -> str | None:
    try:
        return read_engine_token(getattr(args, "engine_token_file", None))
    except EngineTokenError as error:
        raise ConfigError(str(error)) from None


def read_template_text(path: str) -> str:
    """A --chat-template file's template (dpgate/chat/template.py reads JSON-wrapped ones too)."""
    from dpgate.chat.template import read_template_file

    text = read_template_file(path)
    if not text.strip():
        raise OSError(0, "the file is empty")
    return text


def rank_from_hostname(hostname: str) -> int:
    """The DP rank a StatefulSet pod's hostname carries in its trailing `-N` (e.g. dpgate-engine-2 -> 2).

    The first label is used, so a fully qualified name works too. Leading zeros are refused: no
    StatefulSet names a pod `-01`, so such a name is a misconfiguration, not an ordinal.
    """
    label = hostname.split(".", 1)[0]
    match = _HOSTNAME_ORDINAL.search(label)
    if match is None:
        raise ConfigError(
            f"--data-parallel-rank-from-hostname: hostname {hostname!r} does not end in -N "
            "(a StatefulSet pod ordinal such as dpgate-engine-0)"
        )
    return int(match.group(1))


def _data_parallel_rank(args: argparse.Namespace) -> int:
    if not args.data_parallel_rank_from_hostname:
        return 0 if args.data_parallel_rank is None else args.data_parallel_rank
    if args.data_parallel_rank is not None:
        raise ConfigError("--data-parallel-rank and --data-parallel-rank-from-hostname cannot be given together")
    return rank_from_hostname(socket.gethostname())


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="known model name, GGUF file or Hugging Face directory (default: %(default)s)",
    )
    parser.add_argument("--served-model-name", default=None, help="name clients use (default: from --model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="gRPC port (default: %(default)s)")
    parser.add_argument(
        "--dtype",
        default=AUTO_DTYPE,
        help="activation and KV-cache dtype: auto (the default: chosen by the CPU and kernels, see "
        "docs/engine.md), float32, bfloat16 or float16",
    )
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    parser.add_argument(
        "--data-parallel-rank", type=int, default=None, help="this engine's global DP rank (default: 0)"
    )
    parser.add_argument(
        "--data-parallel-rank-from-hostname",
        action="store_true",
        help="take the DP rank from the trailing -N of the hostname (a Kubernetes StatefulSet pod's ordinal)",
    )
    parser.add_argument("--data-parallel-size", type=int, default=1, help="number of DP ranks in the deployment")
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus HTTP port (default: off)")
    add_log_format_argument(parser)
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block (default: %(default)s)")
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="KV-cache blocks (default: from memory)")
    parser.add_argument(
        "--kv-cache-memory-mb",
        type=int,
        default=512,
        help="memory for the KV cache when --num-kv-blocks is not given (default: %(default)s)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=32, help="sequences per batch (default: %(default)s)")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        help="tokens per step, prefill chunks included (default: %(default)s)",
    )
    parser.add_argument(
        "--step-tokens-after-a-finished-prompt",
        type=int,
        default=128,
        help="a step that finishes a prompt takes no more prompt tokens once it holds this many, so prompts "
        "in a burst get first tokens in turn; set it to --max-num-batched-tokens to fill every step "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="queued requests before new ones get RESOURCE_EXHAUSTED (default: %(default)s)",
    )
    parser.add_argument(
        "--max-stop-strings",
        type=int,
        default=DEFAULT_MAX_STOP_STRINGS,
        help="stop strings one request may give; more is INVALID_ARGUMENT (default: %(default)s)",
    )
    parser.add_argument(
        "--max-stop-string-bytes",
        type=int,
        default=DEFAULT_MAX_STOP_STRING_BYTES,
        help="UTF-8 bytes a request's stop strings may hold together; more is INVALID_ARGUMENT (default: %(default)s)",
    )
    parser.add_argument(
        "--engine-token-file",
        metavar="FILE",
        help="serve only calls carrying this file's token (metadata x-dpgate-engine-token), as its gateway sends "
        "them; grpc.health stays open. $DPGATE_ENGINE_TOKEN works too (default: no token, no lock)",
    )
    parser.add_argument(
        "--grammar-compile-timeout-s",
        type=float,
        default=DEFAULT_COMPILE_BUDGET_S,
        help="seconds one grammar (structured output, or a tool-call grammar) may take to build; it runs in "
        "a child process that is stopped then, and the request gets INVALID_ARGUMENT (default: %(default)s)",
    )
    parser.add_argument(
        "--quantization",
        default="auto",
        help="weight storage: auto (the default: int-dot for a GGUF checkpoint on the batch-invariant kernels, "
        "the fastest measured on every CPU kind; int8 otherwise), "
        "int8 (weight-only, one scale per output row), "
        "gguf (the GGUF's own quantized blocks as shipped, e.g. Q4_1, Q4_K: the file's grid exactly; layers in a "
        "format without a kernel, and every layer under --no-batch-invariant, serve int8), "
        "int-dot (the GGUF's blocks times activations quantized to int8 per 32 values, exact integer sums; "
        "needs the batch-invariant kernels) or none",
    )
    parser.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compute with dpgate's batch-invariant kernels, so a request's tokens and logprobs never depend "
        "on its batch (the default); --no-batch-invariant uses torch's kernels",
    )
    parser.add_argument(
        "--kernel-isa",
        default="auto",
        help="the most capable instruction set the batch-invariant kernels may use: auto (the default: the "
        "fastest this CPU runs and passes its start-up self-check), avx512_vnni, avx512, avx2 or scalar; a cap, "
        "e.g. to serve as an AVX2-only CPU would. Every set gives the same bits",
    )
    add_prefix_caching_argument(parser)
    add_parallel_arguments(parser)
    add_chat_arguments(parser)
    parser.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="torch compute threads of the engine, split among its tensor-parallel ranks; give engines that "
        "share a host a share of its cores (default: measured at start-up, the fewest of the CPUs in the "
        "engine's affinity mask, or halves of them, whose decode steps are within 3 percent of the fastest)",
    )


def add_prefix_caching_argument(parser: argparse.ArgumentParser) -> None:
    """`--no-prefix-caching`; `dpgate serve` passes it on to every engine."""
    parser.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep computed full KV blocks and reuse them for later prompts that start with the same tokens "
        '(the default; a hit gives the same bits as a miss, docs/engine.md "Prefix caching"); '
        "--no-prefix-caching computes every prompt in full",
    )


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's Chat flags (docs/engine.md, "Chat"); `dpgate serve` passes them on to every engine."""
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="Jinja chat template replacing the model's own (default: the model's, from GGUF or tokenizer files)",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        help="how Chat finds reasoning in the output: think (between the reasoning markers) or none "
        "(default: by the model's architecture)",
    )
    parser.add_argument(
        "--reasoning-markers",
        default=None,
        metavar="START,END",
        help="the markers around reasoning (default: <think>,</think>)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="how Chat finds tool calls in the output: hermes (JSON between <tool_call> and </tool_call>) or none "
        "(default: by the model's architecture)",
    )


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine's parallelism flags; `dpgate serve` passes them on to every engine."""
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="processes that split each layer's weights, Megatron-style (default: %(default)s)",
    )
    parser.add_argument(
        "--decode-context-parallel-size",
        type=int,
        default=1,
        help="TP ranks that split the KV cache's tokens instead of replicating it; divides "
        "--tensor-parallel-size (default: %(default)s)",
    )
    parser.add_argument(
        "--dcp-kv-interleave",
        type=int,
        default=1,
        help="consecutive positions each DCP rank holds in turn; divides --block-size (default: %(default)s)",
    )
    parser.add_argument(
        "--allow-oversubscribe",
        action="store_true",
        help="allow more tensor-parallel processes than cores (slow; for tests)",
    )
    parser.add_argument(
        "--worker-step-timeout",
        type=float,
        default=30.0,
        help="seconds a tensor-parallel worker may take for one step before the engine stops, naming it "
        "(default: %(default)s)",
    )


def _check_port(flag: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(f"{flag} {port} must be in [1, 65535]")
