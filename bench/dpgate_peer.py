"""dpgate's side of bench/engine_vs_llamacpp.py: the same three figures through the engine core
(`LLMEngine.step()`, the loop behind the gRPC server), greedy, eos ignored.

- decode: one request whose prompt is one token, `num_tokens` steps of one token each (the first
  feeds the prompt), as llama-bench's tg runs from an empty context;
- prefill: one request of the whole prompt and max_tokens 1: one step (the token budget holds it);
- batched: all requests added at once and run to the end under the served scheduler (decodes
  first, then prompt chunks within the token budget). Steps that feed prompt tokens count as
  prefill time (the decodes riding along in them included), the others as decode time; prefill
  rate = prompt tokens / prefill time, decode rate = tokens of decode-only steps / decode time,
  end to end = all output tokens / wall time.
"""

from __future__ import annotations

import subprocess
import time

PROMPT_TOKENS, OUTPUT_TOKENS, CONCURRENCY = 256, 128, 16


class DpgatePeer:
    def __init__(
        self, quantization: str, isa: str | None, max_num_seqs: int, max_model_len: int, clock=time.perf_counter
    ):
        from machine import engine_numerics

        from engines.config import EngineConfig
        from engines.engine import LLMEngine
        from engines.model.source import resolve_model
        from engines.runner.loader import load_for_serving
        from engines.runner.model_runner import ModelRunner
        from engines.scheduling.scheduler import SchedulerConfig
        from engines.serving.request_builder import ModelLimits
        from engines.serving.startup import freeze_startup_heap

        self.numerics = engine_numerics(True, isa, quantization=quantization)
        self.loaded = loaded = load_for_serving(resolve_model("smollm2-135m-instruct"), self.numerics)
        budget = EngineConfig().max_num_batched_tokens  # the served default token budget
        num_blocks = max_num_seqs * max_model_len // 16 + 16
        runner = ModelRunner(loaded, max_model_len, num_blocks=num_blocks, block_size=16)
        runner.warm_up(max_num_seqs, budget)
        self.engine = LLMEngine(runner, SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget))
        freeze_startup_heap()  # as the engine server does once started
        self.limits = ModelLimits("m", loaded.config.vocab_size, max_model_len, loaded.tokenizer.eos_token_ids)
        self.next_id = 0
        self.clock = clock

    def _add(self, prompt: list[int], max_tokens: int) -> None:
        from dpgate.v1 import generate_pb2 as pb
        from engines.serving.request_builder import build_sequence

        request = pb.GenerateRequest(
            request_id=str(self.next_id),
            token_ids=pb.TokenIds(ids=prompt),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        self.next_id += 1
        self.engine.add(build_sequence(request, self.limits, self.loaded.tokenizer.tokenizer))

    def _run_to_end(self) -> list[tuple[float, int, int]]:
        """(seconds, prompt tokens fed, tokens generated) of every step until the engine is idle."""
        steps = []
        while self.engine.has_work:
            started = self.clock()
            self.engine.step()
            stats = self.engine.last_step
            steps.append((self.clock() - started, stats.num_prompt_tokens, stats.num_generated_tokens))
        return steps

    def decode(self, first_token: int, num_tokens: int) -> float:
        self._add([first_token], num_tokens)
        steps = self._run_to_end()
        return len(steps) / sum(seconds for seconds, _, _ in steps)

    def prefill(self, prompt: list[int]) -> float:
        self._add(prompt, 1)
        steps = self._run_to_end()
        return len(prompt) / sum(seconds for seconds, _, _ in steps)

    def batched(self, prompts: list[list[int]], num_output: int) -> dict[str, float]:
        started = self.clock()
        for prompt in prompts:
            self._add(prompt, num_output)
        steps = self._run_to_end()
        wall = self.clock() - started
        t_pp = sum(seconds for seconds, fed, _ in steps if fed)
        t_tg = sum(seconds for seconds, fed, _ in steps if not fed)
        decoded = sum(generated for _, fed, generated in steps if not fed)
        return {
            "prefill": sum(len(p) for p in prompts) / t_pp,
            "decode": decoded / t_tg,
            "end_to_end": len(prompts) * num_output / wall,
        }


class ServedDpgatePeer:
    """The same three figures from `dpgate engine` over gRPC, as a user gets them (the default):
    the engine in its own process with its served defaults (its start-up trial picks the threads
    unless `num_threads` is given), timed on the client's clock from the streamed tokens.

    - decode: (tokens - 1) / (first to last token) of one request from a one-token prompt;
    - prefill: prompt tokens / time to the first token of one request with max_tokens 1;
    - batched: all requests sent at once; prefill rate = prompt tokens / time until every request
      had its first token, decode rate = tokens after that / the time after it, end to end = all
      output tokens / wall time.
    """

    def __init__(
        self,
        quantization: str,
        max_num_seqs: int,
        max_model_len: int,
        num_threads: int | None = None,
        kernel_isa: str | None = None,
    ):
        import grpc

        from dpgate.v1 import control_pb2, control_pb2_grpc, generate_pb2_grpc
        from tests.support.processes import dpgate_command, free_port, poll_until_serving

        port = free_port()
        flags = ["engine", "--port", str(port), "--quantization", quantization, "--max-num-seqs", str(max_num_seqs),
                 "--max-model-len", str(max_model_len)]  # fmt: skip
        if num_threads is not None:
            flags += ["--num-threads", str(num_threads)]
        if kernel_isa is not None:
            flags += ["--kernel-isa", kernel_isa]
        self.process = subprocess.Popen(dpgate_command(*flags), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address = f"127.0.0.1:{port}"
        poll_until_serving(address, timeout=300, process=self.process, interval=0.2)
        self.channel = grpc.insecure_channel(address)
        self.stub = generate_pb2_grpc.InferenceServiceStub(self.channel)
        info = control_pb2_grpc.ControlServiceStub(self.channel).GetModelInfo(control_pb2.GetModelInfoRequest())
        kernels = f"{info.quantization}, {info.kernels}"
        self.description = f"dpgate engine over gRPC, {info.num_threads} thread(s) ({kernels})"

    def _stream(self, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
        from dpgate.v1 import generate_pb2 as pb

        request = pb.GenerateStreamRequest(
            token_ids=pb.TokenIds(ids=prompt),
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
        )
        sent, arrivals = time.perf_counter(), []
        for message in self.stub.GenerateStream(request, timeout=3600):
            if message.HasField("delta"):
                arrivals += [time.perf_counter()] * len(message.delta.token_ids)
        return sent, arrivals

    def decode(self, first_token: int, num_tokens: int) -> float:
        _, arrivals = self._stream([first_token], num_tokens)
        return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])

    def prefill(self, prompt: list[int]) -> float:
        sent, arrivals = self._stream(prompt, 1)
        return len(prompt) / (arrivals[0] - sent)

    def batched(self, prompts: list[list[int]], num_output: int) -> dict[str, float]:
        from concurrent.futures import ThreadPoolExecutor

        started = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            runs = list(pool.map(lambda prompt: self._stream(prompt, num_output), prompts))
        ended = max(arrivals[-1] for _, arrivals in runs)
        all_first = max(arrivals[0] for _, arrivals in runs)
        after = sum(sum(1 for at in arrivals if at > all_first) for _, arrivals in runs)
        return {
            "prefill": sum(len(p) for p in prompts) / (all_first - started),
            "decode": after / (ended - all_first) if ended > all_first else 0.0,
            "end_to_end": sum(len(arrivals) for _, arrivals in runs) / (ended - started),
        }

    def close(self) -> None:
        from tests.support.processes import stop_process

        self.channel.close()
        stop_process(self.process, timeout=30)
