"""The resolvers behind `--engine-dns`: every address, answers told apart from failures."""

from __future__ import annotations

import asyncio

import pytest

from gateway.dns_resolver import DnsLookupError, NameserverResolver, SystemResolver, make_resolver
from tests.gateway.dns_server import TestDnsServer, silent_udp_socket


def resolve(resolver, name: str) -> tuple[str, ...]:
    return asyncio.run(resolver.resolve(name))


def test_every_a_and_aaaa_record_is_returned_sorted():
    with TestDnsServer() as dns:
        dns.resolver.set("engines.test", ["127.0.0.3", "127.0.0.2", "::1", "127.0.0.2"])
        resolver = NameserverResolver("127.0.0.1", dns.port, timeout_s=2)
        assert resolve(resolver, "engines.test") == ("127.0.0.2", "127.0.0.3", "::1")
        dns.resolver.set("engines.test", ["127.0.0.4"])
        assert resolve(resolver, "engines.test.") == ("127.0.0.4",)


def test_a_missing_name_or_an_empty_answer_means_no_engines():
    with TestDnsServer() as dns:
        dns.resolver.set("empty.test", [])
        resolver = NameserverResolver("127.0.0.1", dns.port, timeout_s=2)
        assert resolve(resolver, "missing.test") == ()
        assert resolve(resolver, "empty.test") == ()


def test_a_server_failure_is_a_lookup_error_not_an_empty_answer():
    with TestDnsServer() as dns:
        dns.resolver.set("engines.test", ["127.0.0.2"])
        dns.resolver.failing.add("engines.test")
        with pytest.raises(DnsLookupError, match="answered SERVFAIL"):
            resolve(NameserverResolver("127.0.0.1", dns.port, timeout_s=2), "engines.test")


def test_a_silent_nameserver_times_out_as_a_lookup_error():
    with silent_udp_socket() as sock:
        resolver = NameserverResolver("127.0.0.1", sock.getsockname()[1], timeout_s=0.2)
        with pytest.raises(DnsLookupError, match=r"no answer from nameserver 127\.0\.0\.1:\d+ within 0\.2s"):
            resolve(resolver, "engines.test")


def test_a_truncated_udp_answer_is_asked_again_over_tcp():
    ips = [f"127.0.1.{n}" for n in range(1, 61)]  # 60 A records: past 512 bytes
    with TestDnsServer(truncate_udp=True) as dns:
        dns.resolver.set("many.test", ips)
        answer = resolve(NameserverResolver("127.0.0.1", dns.port, timeout_s=2), "many.test")
    assert answer == tuple(sorted(ips, key=lambda ip: int(ip.rsplit(".", 1)[1])))


def test_the_system_resolver_answers_localhost_and_nothing_for_an_invalid_name():
    resolver = make_resolver(None, timeout_s=5)
    assert isinstance(resolver, SystemResolver)
    assert "127.0.0.1" in resolve(resolver, "localhost")
    assert resolve(resolver, "no-such-engine.invalid") == ()  # RFC 6761: .invalid never resolves
