"""`python -m tests.engines.greedy_probe ISA [QUANTIZATION]`: greedy tokens and logprobs of a few
prompts from SmolLM2 in the served default (or with --quantization QUANTIZATION), its kernels
capped at ISA, printed as JSON (one child process per instruction set, so torch's own vector
code can be capped too with ATEN_CPU_CAPABILITY)."""

from __future__ import annotations

import json
import sys

from dpgate.v1 import generate_pb2 as pb
from engines import kernels
from engines.engine import LLMEngine
from engines.kernels.cpu import cpu_info
from engines.model.numerics import KERNEL_ISAS, choose_numerics
from engines.model.source import resolve_model
from engines.runner.loader import load_for_serving
from engines.runner.model_runner import ModelRunner
from engines.serving.request_builder import ModelLimits, build_sequence

PROMPTS = ["The history of the printing press begins", "def quicksort(items):", "Le chat est assis sur"]


def main(isa: str, quantization: str = "int8") -> None:
    isas = tuple(name for name in KERNEL_ISAS[KERNEL_ISAS.index(isa) :] if name in kernels.supported_isas())
    numerics = choose_numerics("auto", quantization, True, cpu_info(), isas)
    loaded = load_for_serving(resolve_model("smollm2-135m-instruct"), numerics)
    engine = LLMEngine(ModelRunner(loaded, 256))
    limits = ModelLimits("m", loaded.config.vocab_size, 256, loaded.tokenizer.eos_token_ids)
    for i, prompt in enumerate(PROMPTS):
        request = pb.GenerateRequest(
            request_id=str(i),
            text=prompt,
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingCriteria(max_tokens=12, ignore_eos=True),
            logprobs=pb.LogprobsOptions(top_n=2),
        )
        engine.add(build_sequence(request, limits, loaded.tokenizer.tokenizer))
    sampled: dict[str, list] = {}
    while engine.has_work:
        for output in engine.step():
            sampled.setdefault(output.request_id, []).extend(
                (s.token_id, s.logprob, [list(t) for t in s.top_logprobs]) for s in output.logprobs
            )
    print(json.dumps({"kernels": numerics.kernels, "outputs": sampled}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
