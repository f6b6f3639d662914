"""When the gateway's own health says SERVING: one pure rule over what the engine pool knows.

`dpgate gateway` is ready while any engine is routable: a pin to a rank that is missing gets
UNAVAILABLE (retry) and unpinned calls go to the engines there are. `dpgate serve
--data-parallel-size N` started its N engines itself, so it waits for all of them: a client that
sees SERVING may pin any rank 0..N-1 at once. Once that happened the rule is the standalone one,
so losing one engine later does not take the whole front door out of a load balancer.
"""

from __future__ import annotations

from collections.abc import Set


def is_ready(
    routable_ranks: Set[int],
    data_parallel_size: int | None,
    ready_data_parallel_size: int | None,
    *,
    has_been_ready: bool,
) -> bool:
    """Whether health should report SERVING now.

    `routable_ranks`: ranks of handshaken engines that are healthy and serving.
    `data_parallel_size`: the DP size those engines reported (None before any handshake).
    `ready_data_parallel_size`: `GatewayConfig.ready_data_parallel_size` (None: any engine will do).
    `has_been_ready`: whether this rule ever answered True with every required rank routable.
    """
    if not routable_ranks:
        return False
    if ready_data_parallel_size is None or has_been_ready:
        return True
    required = set(range(ready_data_parallel_size))
    return data_parallel_size == ready_data_parallel_size and required <= routable_ranks
