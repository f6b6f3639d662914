"""A DNS server for tests, on 127.0.0.1 (UDP and TCP on one port), whose answers a test changes.

dnslib's own DNSServer runs in threads; `set(name, [ips])` replaces a name's A/AAAA records at
once, so a test can add and remove engines from "the headless service" while calls flow.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
from collections.abc import Iterable

from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer


class ChangingResolver(BaseResolver):
    """Answers from a table the test edits; unknown names are NXDOMAIN, `failing` names SERVFAIL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, tuple[str, ...]] = {}
        self.failing: set[str] = set()
        self.num_queries = 0

    def set(self, name: str, ips: Iterable[str]) -> None:
        with self._lock:
            self._records[name.rstrip(".").lower()] = tuple(ips)

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        with self._lock:
            self.num_queries += 1
            ips = self._records.get(name)
            is_failing = name in self.failing
        if is_failing:
            reply.header.rcode = RCODE.SERVFAIL
        elif ips is None:
            reply.header.rcode = RCODE.NXDOMAIN
        else:
            for ip in ips:
                version = ipaddress.ip_address(ip).version
                if version == 4 and request.q.qtype == QTYPE.A:
                    reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=0))
                elif version == 6 and request.q.qtype == QTYPE.AAAA:
                    reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(ip), ttl=0))
        return reply


_PORT_PAIR_ATTEMPTS = 20


class _ClassicUdpHandler(DNSHandler):
    udplen = 512  # answers past the classic UDP size arrive truncated, as from a strict server


class TestDnsServer:
    """UDP and TCP DNS on 127.0.0.1:`port`; use as a context manager."""

    __test__ = False  # not a pytest class

    def __init__(self, *, truncate_udp: bool = False) -> None:
        self.resolver = ChangingResolver()
        quiet = DNSLogger(logf=lambda _: None)
        handler = _ClassicUdpHandler if truncate_udp else DNSHandler
        # The kernel picks a free UDP port; the same number may already be taken for TCP (an
        # ephemeral client port of some other connection), so on a clash try another pair.
        for _attempt in range(_PORT_PAIR_ATTEMPTS):
            self._udp = DNSServer(self.resolver, address="127.0.0.1", port=0, logger=quiet, handler=handler)
            self.port = self._udp.server.server_address[1]
            try:
                self._tcp = DNSServer(self.resolver, address="127.0.0.1", port=self.port, tcp=True, logger=quiet)
            except OSError as error:
                self._udp.server.server_close()
                if error.errno != errno.EADDRINUSE:
                    raise
                continue
            return
        raise OSError(errno.EADDRINUSE, f"no port free for both UDP and TCP in {_PORT_PAIR_ATTEMPTS} tries")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> TestDnsServer:
        for server in (self._udp, self._tcp):
            # A short poll interval: socketserver's shutdown waits for one (0.5 s by default).
            thread = threading.Thread(target=server.server.serve_forever, args=(0.02,), daemon=True)
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self._udp, self._tcp):
            server.server.shutdown()
            server.server.server_close()


def silent_udp_socket() -> socket.socket:
    """A bound UDP socket on 127.0.0.1 that never answers: queries to it time out. Close it after."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock
