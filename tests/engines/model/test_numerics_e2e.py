"""`dpgate engine` says what numerics it chose, at start-up and in GetModelInfo, and `--dtype`
and `--no-batch-invariant` override the CPU's choice."""

from __future__ import annotations

import grpc
import pytest

from dpgate.v1 import control_pb2 as cpb
from dpgate.v1 import control_pb2_grpc, generate_pb2_grpc
from dpgate.v1 import generate_pb2 as pb
from engines.kernels.cpu import cpu_info
from tests.support.processes import free_port, running


@pytest.mark.parametrize(
    ("flags", "dtype", "batch_invariant"),
    [
        ([], "float32", True),
        (["--dtype", "bfloat16"], "bfloat16", True),
        (["--no-batch-invariant"], "bfloat16" if cpu_info().has_native_bf16 else "float32", False),
        (["--no-batch-invariant", "--dtype", "float32", "--quantization", "none"], "float32", False),
        (["--quantization", "int-dot"], "float32", True),  # a safetensors model: its layers serve int8, logged
    ],
)
def test_the_engine_reports_its_numerics(tiny_model_dir, tmp_path, flags, dtype, batch_invariant):
    port, log = free_port(), tmp_path / "engine.log"
    args = ["engine", "--port", str(port), "--model", str(tiny_model_dir), *flags]
    with running(args, port, log_path=str(log)) as engine, grpc.insecure_channel(engine.address) as channel:
        info = control_pb2_grpc.ControlServiceStub(channel).GetModelInfo(cpb.GetModelInfoRequest())
        reply = generate_pb2_grpc.InferenceServiceStub(channel).Generate(
            pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]), stopping=pb.StoppingCriteria(max_tokens=4))
        )
    assert (info.dtype, info.batch_invariant) == (dtype, batch_invariant)
    # --quantization auto (the default) serves a safetensors model on int8: it has no GGUF blocks.
    assert info.quantization == (flags[flags.index("--quantization") + 1] if "--quantization" in flags else "int8")
    assert info.kernels.startswith("batch-invariant/") if batch_invariant else info.kernels == "torch"
    assert info.cpu == cpu_info().describe()
    assert len(reply.token_ids) == 4
    started = log.read_text()
    assert f"numerics: {dtype} activations" in started and info.kernels in started and "AVX2" in started
