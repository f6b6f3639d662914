"""Bring-up: wait until every engine answers grpc.health SERVING and the gateway's handshake has
accepted every rank (a call pinned to each rank succeeds through it, and the rank that answers
is the one pinned). A child that exits meanwhile ends the stage at once as ENGINE_FAILED, with
its last log lines."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpgate.e2e.children import Child
from dpgate.e2e.contracts import FailureClass
from dpgate.e2e.plan import Plan
from dpgate.e2e.stages import StageFailure
from dpgate.v1 import control_pb2, control_pb2_grpc

RANK_KEY = "x-data-parallel-rank"
POLL_S = 0.1
PROBE_TIMEOUT_S = 1.0


def check_children(children: list[Child], when: str) -> None:
    """Raise ENGINE_FAILED naming the first child that has exited, with its last log lines."""
    for child in children:
        status = child.exited()
        if status is not None:
            raise StageFailure(
                FailureClass.ENGINE_FAILED,
                f"{child.name} exited with status {status} {when}; "
                f"last lines of {child.spec.log_path}:\n{child.tail()}",
            )


def engine_serving(channel: grpc.Channel) -> bool:
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def rank_accepted(channel: grpc.Channel, rank: int) -> bool:
    """A GetServerInfo pinned to `rank` through the gateway is answered by that rank."""
    stub = control_pb2_grpc.ControlServiceStub(channel)
    try:
        reply = stub.GetServerInfo(
            control_pb2.GetServerInfoRequest(), metadata=[(RANK_KEY, str(rank))], timeout=PROBE_TIMEOUT_S
        )
    except grpc.RpcError:
        return False
    return reply.parallelism.data_parallel_rank == rank


def bring_up(plan: Plan, children: list[Child], deadline: float) -> str:
    engines = {spec.name: grpc.insecure_channel(spec.endpoint) for spec in plan.engines}
    gateway = grpc.insecure_channel(plan.gateway.endpoint)
    waiting_engines = list(engines)
    waiting_ranks = list(range(len(plan.engines)))
    started = time.monotonic()
    try:
        while True:
            check_children(children, "during bring-up")
            waiting_engines = [name for name in waiting_engines if not engine_serving(engines[name])]
            if not waiting_engines:
                waiting_ranks = [rank for rank in waiting_ranks if not rank_accepted(gateway, rank)]
                if not waiting_ranks:
                    seconds = time.monotonic() - started
                    return f"{len(engines)} engines SERVING and accepted by the gateway after {seconds:.1f}s"
            if time.monotonic() >= deadline:
                missing = [*(f"{name} not SERVING" for name in waiting_engines)]
                if not waiting_engines:
                    missing.append(f"the gateway has not accepted ranks {waiting_ranks}")
                raise StageFailure(FailureClass.BRINGUP_TIMEOUT, f"{'; '.join(missing)} within the budget")
            time.sleep(POLL_S)
    finally:
        for channel in (*engines.values(), gateway):
            channel.close()
