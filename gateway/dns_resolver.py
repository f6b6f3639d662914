"""Resolving a headless service's name to every address behind it, without blocking the event loop.

Two resolvers answer the same question, "which A and AAAA addresses does this name have now?":

- `SystemResolver` asks the host's resolver through `loop.getaddrinfo` (run in the loop's
  executor), so /etc/resolv.conf, its search domains and /etc/hosts apply as for any program:
  inside a Kubernetes pod `dpgate-engine` resolves to the headless service of the pod's namespace.
- `NameserverResolver` (`--dns-server HOST:PORT`) sends its own queries to one nameserver, packed
  and parsed with dnslib over asyncio UDP (TCP when the answer was truncated). The name is taken
  as fully qualified: no search domains. Tests point it at a DNS server they run on 127.0.0.1.

Both tell an answer apart from a failure: a name that does not exist or has no address is an
answer (no engines, `()`), while a timeout or a server failure raises `DnsLookupError`, so the
caller keeps the engines it had instead of retiring them all over one lost packet.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
from typing import Protocol

from dnslib import EDNS0, QTYPE, RCODE, DNSError, DNSRecord

# Large enough for a few hundred A records in one UDP answer; a larger answer arrives truncated
# and is asked again over TCP.
_EDNS_PAYLOAD_BYTES = 4096
# getaddrinfo errors that mean "no such name / no address": an answer, not a failure.
_NO_ADDRESS_ERRORS = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None), getattr(socket, "EAI_ADDRFAMILY", None))
    if code is not None
)  # fmt: skip


class DnsLookupError(Exception):
    """The lookup failed (timeout, unreachable server, server failure): the answer is unknown."""


class Resolver(Protocol):
    async def resolve(self, name: str) -> tuple[str, ...]:
        """Every IPv4 and IPv6 address of `name`, sorted; () when it has none. Raises DnsLookupError."""
        ...


def _sorted_unique(addresses: list[str]) -> tuple[str, ...]:
    """IPv4 before IPv6, each in numeric order, written the one canonical way (so sets compare)."""
    parsed = sorted({ipaddress.ip_address(text) for text in addresses}, key=lambda ip: (ip.version, ip.packed))
    return tuple(ip.compressed for ip in parsed)


class SystemResolver:
    """The host's resolver via `loop.getaddrinfo` (a thread of the executor, never the loop itself)."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    async def resolve(self, name: str) -> tuple[str, ...]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), self._timeout_s)
        except socket.gaierror as error:
            if error.errno in _NO_ADDRESS_ERRORS:
                return ()
            raise DnsLookupError(f"{name}: {error.strerror}") from None
        except TimeoutError:
            raise DnsLookupError(f"{name}: no answer within {self._timeout_s}s") from None
        addresses = [info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
        # A scoped IPv6 address (fe80::1%eth0) is not a routable engine address: drop the scope.
        return _sorted_unique([address.split("%", 1)[0] for address in addresses])


class _Datagram(asyncio.DatagramProtocol):
    """One UDP exchange: the first datagram whose id matches completes `answer`."""

    def __init__(self, query_id: int) -> None:
        self._query_id = query_id
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: object) -> None:
        if len(data) >= 2 and struct.unpack("!H", data[:2])[0] == self._query_id and not self.answer.done():
            self.answer.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)


class NameserverResolver:
    """Queries one nameserver directly (A and AAAA at once), with dnslib packing the messages."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self._server = (host.strip("[]"), port)
        self._timeout_s = timeout_s

    async def resolve(self, name: str) -> tuple[str, ...]:
        try:
            answers = await asyncio.wait_for(
                asyncio.gather(self._query(name, "A"), self._query(name, "AAAA")), self._timeout_s
            )
        except TimeoutError:
            raise DnsLookupError(f"{name}: no answer from {self._describe()} within {self._timeout_s}s") from None
        except OSError as error:
            raise DnsLookupError(f"{name}: {self._describe()} cannot be reached ({error.strerror})") from None
        except (DNSError, asyncio.IncompleteReadError):
            raise DnsLookupError(f"{name}: {self._describe()} sent a malformed answer") from None
        return _sorted_unique([address for answer in answers for address in answer])

    def _describe(self) -> str:
        host, port = self._server
        return f"nameserver {host}:{port}"

    async def _query(self, name: str, qtype: str) -> list[str]:
        query = DNSRecord.question(name, qtype)
        query.add_ar(EDNS0(udp_len=_EDNS_PAYLOAD_BYTES))
        reply = DNSRecord.parse(await self._exchange_udp(query))
        if reply.header.tc:
            reply = DNSRecord.parse(await self._exchange_tcp(query))
        rcode = reply.header.rcode
        if rcode == RCODE.NXDOMAIN:
            return []
        if rcode != RCODE.NOERROR:
            raise DnsLookupError(f"{name}: {self._describe()} answered {RCODE.get(rcode)}")
        wanted = getattr(QTYPE, qtype)
        return [str(record.rdata) for record in reply.rr if record.rtype == wanted]

    async def _exchange_udp(self, query: DNSRecord) -> bytes:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_datagram_endpoint(
            lambda: _Datagram(query.header.id), remote_addr=self._server
        )
        try:
            transport.sendto(query.pack())
            return await protocol.answer
        finally:
            transport.close()

    async def _exchange_tcp(self, query: DNSRecord) -> bytes:
        reader, writer = await asyncio.open_connection(*self._server)
        try:
            packed = query.pack()
            writer.write(struct.pack("!H", len(packed)) + packed)
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(length)
        finally:
            writer.close()


def make_resolver(dns_server: tuple[str, int] | None, timeout_s: float) -> Resolver:
    """The resolver `--dns-server` asks for: that nameserver, or the system's when None."""
    if dns_server is None:
        return SystemResolver(timeout_s)
    return NameserverResolver(dns_server[0], dns_server[1], timeout_s)
