"""Engines from DNS: every address of each `--engine-dns NAME:PORT`, looked up again and again.

A headless Kubernetes Service answers its name with one A/AAAA record per ready pod, so the set
of engines is whatever the name resolves to now. Every `--engine-dns-interval` seconds each name
is resolved (`gateway.dns_resolver`, never blocking the loop) and the union of the answers is
handed to `EnginePool.set_discovered`, which handshakes new engines and retires vanished ones
after their calls in flight. A name whose lookup failed keeps its last answer: one lost packet
or a restarting nameserver must not retire every engine.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

from gateway.dns_resolver import DnsLookupError, Resolver
from gateway.engine_pool import EnginePool

logger = logging.getLogger("dpgate.gateway.discovery")


def engine_address(ip: str, port: int) -> str:
    """`HOST:PORT` as the gateway writes engine addresses (IPv6 in brackets)."""
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


class EngineDiscovery:
    """Keeps the pool's discovered engines equal to what the names resolve to."""

    def __init__(
        self, targets: tuple[tuple[str, int], ...], resolver: Resolver, interval_s: float, pool: EnginePool
    ) -> None:
        self._targets = targets
        self._resolver = resolver
        self._interval_s = interval_s
        self._pool = pool
        self._answers: dict[tuple[str, int], tuple[str, ...]] = {}
        self._failing: set[tuple[str, int]] = set()  # targets whose last lookup failed (logged once)

    async def run(self) -> None:
        """Resolve now and then every interval, until cancelled."""
        while True:
            try:
                await self.refresh()
            except Exception:  # a bug here must not stop discovery for good
                logger.exception("--engine-dns refresh failed unexpectedly")
            await asyncio.sleep(self._interval_s)

    async def refresh(self) -> None:
        """One round: resolve every name at once, then update the pool."""
        results = await asyncio.gather(
            *(self._resolver.resolve(name) for name, _ in self._targets), return_exceptions=True
        )
        for target, result in zip(self._targets, results, strict=True):
            if isinstance(result, DnsLookupError):
                self._lookup_failed(target, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                self._answered(target, result)
        self._pool.set_discovered({engine_address(ip, port) for (_, port), ips in self._answers.items() for ip in ips})

    def _lookup_failed(self, target: tuple[str, int], error: DnsLookupError) -> None:
        if target not in self._failing:
            self._failing.add(target)
            kept = len(self._answers.get(target, ()))
            logger.warning("--engine-dns lookup failed (%s); keeping its %d engines until it answers", error, kept)

    def _answered(self, target: tuple[str, int], ips: tuple[str, ...]) -> None:
        self._failing.discard(target)
        if self._answers.get(target) != ips:
            name, port = target
            logger.info("--engine-dns %s:%d resolves to %s", name, port, ", ".join(ips) or "no address")
        self._answers[target] = ips
