"""The gateway learns the topology from the engines and refuses engines that contradict it."""

from __future__ import annotations

import time

import grpc
import pytest

from tests.support.gateway_processes import (
    FAST_HEALTH,
    RANK_KEY,
    GatewayProcess,
    SyntheticEngineProcess,
    generate_request,
    inference_stub,
)

# (rank, dp size, extra flags, refusal reason)
MISFITS = [
    (1, 3, (), "dp_size_mismatch"),
    (0, 2, (), "duplicate_rank"),
    (2, 2, (), "rank_out_of_range"),
    (1, 2, ("--model", "another-model"), "model_mismatch"),
]


def test_engines_that_break_the_handshake_are_refused(log_dir):
    good = SyntheticEngineProcess(0, 2, log_dir)
    misfits = [SyntheticEngineProcess(rank, size, log_dir, *flags) for rank, size, flags, _ in MISFITS]
    engines = [good, *misfits]
    gateway = None
    try:
        good.start()
        good.wait_serving()
        gateway = GatewayProcess([e.address for e in engines], *FAST_HEALTH, log_dir=log_dir, name="gateway-hs")
        gateway.wait_ranks([0])  # the first engine fixes DP size 2 and the model
        for engine in misfits:
            engine.start()
        for engine in misfits:
            engine.wait_serving()
        deadline = time.monotonic() + 10
        expected = {reason for *_, reason in MISFITS}
        while True:
            samples = gateway.metrics()
            refused = {
                name.split('reason="', 1)[1].split('"', 1)[0]
                for name, value in samples.items()
                if name.startswith("dpgate_gateway_engines_refused_total{") and value >= 1
            }
            if refused == expected:
                break
            assert time.monotonic() < deadline, refused
            time.sleep(0.1)
        time.sleep(1.0)  # several more probes: the refusals must not repeat in the log or the metric
        samples = gateway.metrics()
        for reason in expected:
            assert samples[f'dpgate_gateway_engines_refused_total{{reason="{reason}"}}'] == 1
        log = gateway.log_path.read_text()
        for engine in misfits:
            assert log.count(f"refused engine {engine.address} ") == 1, log

        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_stub(channel)
            # Rank 1 belongs to the deployment (DP size 2) but only misfits claimed it: retryable.
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(generate_request(1), metadata=[(RANK_KEY, "1")], timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert info.value.details().startswith("data parallel rank 1 of data parallel size 2 ")
            # Rank 2 is outside it, whatever the misfit reporting it says.
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(generate_request(1), metadata=[(RANK_KEY, "2")], timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().endswith("connected ranks: [0]")
            for _ in range(6):  # unpinned calls only ever reach the accepted engine
                _, call = stub.Generate.with_call(generate_request(1), timeout=5)
                assert dict(call.trailing_metadata())[RANK_KEY] == "0"
        for engine in misfits:
            assert engine.requests_total().get("Generate", 0) == 0
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()
