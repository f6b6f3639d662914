"""The adversarial workload (`dpgate e2e --workload adversarial`, issue 22): one client cannot
hurt another. Every attack of the issue is replayed against the running deployment while a
neighbour (dpgate/e2e/neighbour.py) sends small calls and health probes from 127.0.0.1:

- engine-side (dpgate/e2e/adversarial_engine.py): poison sampling parameters, a 4 MB prompt, a
  JSON schema nested 900 deep, NaN in chat_template_kwargs, 100,000 stop strings, each refused
  with its own code and a message naming the field or flag; request ids reused after a cancel;
- gateway-side (dpgate/e2e/adversarial_gateway.py), from 127.0.0.2: an unpinned Abort while an
  engine is stopped (SIGSTOP, then SIGCONT), multi-MB bodies without END_STREAM, thousands of
  headers-only streams, an idle-connection flood past --max-connections-per-peer, streams never
  read; the per-peer in-flight and keyless Watch attacks need flags the runner's gateway is not
  started with, and are listed as skipped.

It passes when every attack was refused or ended as documented, the neighbour had no failure and
its p99 stayed under the bound, the gateway never opened a breaker nor marked an engine
unhealthy (its metrics, read at every probe), and the gateway's and the engine's RSS came back
within their bounds. The attackers' addresses are loopback ones, so it needs `--hosts local`.
Figures: one entry per attack (time to refuse, the neighbour's p99, RSS before/peak/after).
"""

from __future__ import annotations

import time

from dpgate.e2e.adversarial_engine import engine_poisons
from dpgate.e2e.adversarial_gateway import AttackPlan, AttackResult, GatewayLimits, Scene, scenarios
from dpgate.e2e.contracts import GateResult, HostsUnavailable, Target

LOOPBACK = "127.0.0.1"


def scene_of(target: Target, limits: GatewayLimits | None = None, api_key: str | None = None) -> Scene:
    """The deployment as the scenarios see it; `limits` and `api_key`: the gateway's flags and one
    of its keys, for a gateway the runner did not start. Raises HostsUnavailable off loopback."""
    host = target.gateway.rsplit(":", 1)[0]
    if host != LOOPBACK:
        raise HostsUnavailable(
            "the adversarial workload attacks from 127.0.0.2 and 127.0.0.3, which reach only a gateway on "
            "127.0.0.1: run it with --hosts local"
        )
    engine_pids = tuple(target.processes[f"engine-{rank}"] for rank in range(len(target.engines)))
    if limits is None:  # the runner's gateway: default limits, the probe timeout equal to the interval
        limits = GatewayLimits(health_interval_s=target.health_interval_s, health_timeout_s=target.health_interval_s)
    gateway_pid = target.processes["gateway"]
    return Scene(target.gateway, gateway_pid, engine_pids, limits, target.gateway_metrics_port, api_key)


def run(
    target: Target, plan: AttackPlan | None = None, limits: GatewayLimits | None = None, api_key: str | None = None
) -> GateResult:
    plan = plan or AttackPlan()
    scene = scene_of(target, limits, api_key)
    chosen, skipped = scenarios(scene)
    results: list[AttackResult] = []
    for result in engine_poisons(scene, plan):
        target.log(result.line)
        results.append(result)
    not_run = []
    for scenario in chosen:
        if time.monotonic() >= target.deadline:
            not_run.append(scenario.__name__)
            continue
        result = scenario(scene, plan)
        target.log(result.line)
        results.append(result)
    figures: dict = {result.name: result.figures for result in results}
    figures["skipped"] = skipped
    problems = [f"{result.name}: {problem}" for result in results for problem in result.problems]
    if not_run:
        problems.append(f"the workload budget ran out before {', '.join(not_run)}")
    detail = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    return GateResult("adversarial", not problems, figures, detail)
