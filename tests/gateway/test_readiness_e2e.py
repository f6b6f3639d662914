"""A standalone gateway with one of two ranks connected: SERVING, and the three pin outcomes.

Rank 0 of a DP-2 deployment is up; rank 1's address is configured but nothing listens there yet.
The gateway serves (rank 0 is routable). A pin to rank 1 is UNAVAILABLE (the deployment has it,
its engine is missing: retry), a pin to rank 2 is INVALID_ARGUMENT (no such rank), and once rank
1's engine comes up the same pin succeeds.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.support.gateway_processes import (
    FAST_HEALTH,
    GATEWAY_SERVICES,
    RANK_KEY,
    GatewayProcess,
    SyntheticEngineProcess,
    generate_request,
    inference_stub,
    stream_request,
)
from tests.support.health import health_status

MISSING_RANK_1 = (
    "data parallel rank 1 of data parallel size 2 is not connected to this gateway right now; connected ranks: [0]"
)


def pinned_error(stub, rank: str, *, stream: bool = False) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        if stream:
            list(stub.GenerateStream(stream_request(2), metadata=[(RANK_KEY, rank)], timeout=5))
        else:
            stub.Generate(generate_request(2), metadata=[(RANK_KEY, rank)], timeout=5)
    return info.value


def test_a_rank_below_the_dp_size_without_its_engine_is_unavailable_until_it_comes(log_dir):
    rank_0 = SyntheticEngineProcess(0, 2, log_dir)
    rank_1 = SyntheticEngineProcess(1, 2, log_dir)  # its port stays closed until started below
    gateway = None
    try:
        gateway = GatewayProcess([rank_0.address, rank_1.address], *FAST_HEALTH, log_dir=log_dir, name="gateway-ready")
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_stub(channel)
            # No engine has handshaken: the DP size is unknown and nothing can be served yet.
            assert health_status(gateway.address) == health_pb2.HealthCheckResponse.NOT_SERVING
            error = pinned_error(stub, "0")
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert error.details() == "data parallel rank 0 cannot be served yet: no engine has passed the handshake"

            rank_0.start()
            rank_0.wait_serving()
            gateway.wait_ranks([0])
            for service in GATEWAY_SERVICES:  # standalone: one routable engine is enough
                assert health_status(gateway.address, service) == health_pb2.HealthCheckResponse.SERVING
            for stream in (False, True):
                error = pinned_error(stub, "1", stream=stream)
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                assert error.details() == MISSING_RANK_1
                error = pinned_error(stub, "2", stream=stream)
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
                assert error.details() == "data parallel rank 2 is not connected to this gateway; connected ranks: [0]"
            _, call = stub.Generate.with_call(generate_request(2), timeout=5)
            assert dict(call.trailing_metadata())[RANK_KEY] == "0"

            rank_1.start()  # the slow engine arrives: the same pin now succeeds
            rank_1.wait_serving()
            gateway.wait_ranks([1])
            _, call = stub.Generate.with_call(generate_request(2), metadata=[(RANK_KEY, "1")], timeout=5)
            assert dict(call.trailing_metadata())[RANK_KEY] == "1"
        assert rank_1.requests_total().get("Generate", 0) >= 1
        assert rank_0.requests_total().get("GenerateStream", 0) == 0  # no pin fell back to rank 0
    finally:
        if gateway is not None:
            gateway.stop()
        rank_0.stop()
        rank_1.stop()
