"""The gateway's configuration: read once into one `GatewayConfig` and validated as a whole.

`validate_config` walks a matrix of rules (DESIGN.md rule 4). Each rule that fails raises
`ConfigError` with one sentence that names the flag and the rule; the command prints it and exits
2. Rules that relate two flags (grace shorter than the shutdown timeout, metrics port apart from
the serving port) live here too, so no other module re-checks its inputs.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from dpgate.logs import LOG_FORMATS
from gateway.routing.policies import POLICIES

MAX_PORT = 65535
# gRPC takes message limits as a C int.
MAX_MESSAGE_BYTES_LIMIT = 2**31 - 1
# The front door's HTTP/2 limits: the ranges a flag may take (RFC 9113 caps streams at 2^31-1;
# the header and HPACK caps keep one connection's memory bounded).
MAX_STREAMS_LIMIT = 2**31 - 1
HEADER_LIST_SIZE_RANGE = (1024, 16 << 20)
HPACK_TABLE_SIZE_LIMIT = 1 << 16
# A DNS name as RFC 1123 allows it (labels of letters, digits and inner hyphens), optionally ending in a dot.
_DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}\.?$){_DNS_LABEL}(\.{_DNS_LABEL})*\.?")
# Hosts that reach this machine, for the "engine is the gateway itself" rule.
_LOCAL_HOSTS = frozenset({"127.0.0.1", "[::1]", "0.0.0.0", "localhost"})
# Secrets come from the environment, so none has to be on a command line (which `ps` shows) or in a
# config file: accepted API keys, separated by whitespace, and the password of an encrypted --tls-key.
API_KEYS_ENV = "DPGATE_API_KEYS"
TLS_KEY_PASSWORD_ENV = "DPGATE_TLS_KEY_PASSWORD"


class ConfigError(ValueError):
    """An invalid flag or flag combination; the message is one sentence naming the flag."""


@dataclass(slots=True, frozen=True)
class GatewayConfig:
    """Everything the gateway reads at start. Durations are seconds, sizes bytes.

    `port` 0 asks the OS for a free port (the gateway logs the one it bound). `metrics_port` None
    disables the metrics endpoint. `api_keys` empty disables authentication. `tls_key_password`
    decrypts an encrypted `tls_key_file` (None: the key must be unencrypted). `max_in_flight` None
    means no gateway-wide limit on concurrent calls. `max_in_flight_per_peer` bounds the calls one
    client address may have in flight (None: half of `max_in_flight` when that is set, else no
    bound), so one client cannot take every slot; `request_body_timeout_s` is how long a call's
    request message may take to arrive after its headers (a headers-only stream holds a slot).

    The front door's HTTP/2 limits (docs/gateway.md, "Limits"): `max_concurrent_streams` and
    `max_header_list_size` are advertised in SETTINGS and enforced; `max_connections` caps open
    client connections; `header_timeout_s` is how long a new connection has for its preface and
    first request's headers (and any field block for its CONTINUATION frames);
    `idle_timeout_s` closes a connection with no open stream for that long; `hpack_table_size`
    caps a client's HPACK dynamic table; `max_continuation_frames` caps one field block's
    CONTINUATION frames; `max_resets_per_second` is the rapid-reset guard.

    `engine_dns` names headless services (`NAME:PORT`) whose every address is an engine; they are
    resolved every `engine_dns_interval_s` through `dns_server` (`HOST:PORT` of a nameserver, None
    for the system resolver), alongside the fixed `engines` (docs/gateway.md, "Discovery from DNS").

    `ready_data_parallel_size` decides when health first turns SERVING. None (`dpgate gateway`):
    whenever any engine is routable. N (`dpgate serve --data-parallel-size N`, which started the N
    engines itself): only once engines reporting DP size N own every rank 0..N-1 and each is
    routable; after that first time, as for None. It is not the deployment's DP size (that
    belongs to the engines' handshake): it is what this gateway waits for before it says ready.
    """

    engines: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = None
    policy: str = "cache-aware"
    # The cache-aware policy's knobs (gateway/routing/cache_aware.py, docs/gateway.md).
    cache_prefill_weight: float = 16.0
    cache_load_weight: float = 1.0
    cache_balance_ratio: float = 1.5
    cache_balance_slack: int = 4
    # Secrets stay out of repr, so a logged config never shows them.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_key_password: str | None = field(default=None, repr=False)
    tls_client_ca_file: str | None = None
    max_message_bytes: int = 4 * 1024 * 1024
    max_in_flight: int | None = None
    # dpgate/engine_token.py: sent on every call to the engines, which refuse calls without it.
    engine_token: str | None = field(default=None, repr=False)
    max_in_flight_per_peer: int | None = None
    request_body_timeout_s: float = 30.0
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 20.0
    min_client_ping_interval_s: float = 5.0
    max_concurrent_streams: int = 1000
    max_header_list_size: int = 16 * 1024
    max_connections: int = 4096
    max_connections_per_peer: int = 1024
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    hpack_table_size: int = 4096
    max_continuation_frames: int = 32
    max_resets_per_second: int = 200
    drain_grace_s: float = 5.0
    shutdown_timeout_s: float = 30.0
    health_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1
    breaker_failure_threshold: int = 5
    breaker_open_s: float = 5.0
    log_format: str = "plain"  # dpgate.logs.LOG_FORMATS
    access_log: bool = True  # one line a call (about 15 us of CPU each)
    prefix_cache_sharing: str = "isolated"  # gateway/tenant.py: API keys share cached prompts or not
    ready_data_parallel_size: int | None = None
    engine_dns: tuple[str, ...] = ()
    engine_dns_interval_s: float = 5.0
    dns_server: str | None = None
    engine_addresses: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    engine_dns_targets: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    dns_server_address: tuple[str, int] | None = field(default=None, compare=False)
    # The OpenAI HTTP API (docs/http-api.md): None serves none. Its limits: the request body, the
    # request line and each header field, open connections, and a keep-alive connection's idle time.
    http_port: int | None = None
    http_max_body_bytes: int = 4 * 1024 * 1024
    http_max_header_bytes: int = 16 * 1024
    http_max_connections: int = 4096
    http_idle_timeout_s: float = 75.0

    @property
    def is_tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def peer_in_flight_limit(self) -> int | None:
        """Calls one client address may have in flight: the flag, else half the gateway's limit."""
        if self.max_in_flight_per_peer is not None:
            return self.max_in_flight_per_peer
        return max(1, self.max_in_flight // 2) if self.max_in_flight is not None else None


def parse_address(text: str, flag: str, example: str = "HOST:PORT, such as 127.0.0.1:50061") -> tuple[str, int]:
    """Split `host:port` (or `[v6]:port`) and check both halves; `flag` names the source in errors."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"{flag} {text!r} must be {example}.")
    port = int(port_text)
    if not 1 <= port <= MAX_PORT:
        raise ConfigError(f"{flag} {text!r} has port {port}, which must be in 1..{MAX_PORT}.")
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(f"{flag} {text!r} has an unbalanced IPv6 bracket.")
    return host.lower(), port


def _check_port(value: int, flag: str, *, allow_zero: bool) -> None:
    low = 0 if allow_zero else 1
    if not low <= value <= MAX_PORT:
        hint = " (0 picks a free port)" if allow_zero else ""
        raise ConfigError(f"{flag} {value} must be in {low}..{MAX_PORT}{hint}.")


def _check_positive(value: float, flag: str) -> None:
    if not value > 0:
        raise ConfigError(f"{flag} {value} must be greater than 0.")


def _check_at_least_one(value: int, flag: str) -> None:
    if value < 1:
        raise ConfigError(f"{flag} {value} must be at least 1.")


def _check_pem_file(path: str, flag: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path!r} is not a readable file.")
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError as error:
        raise ConfigError(f"{flag} {path!r} cannot be read ({error.strerror}).") from None
    if b"-----BEGIN " not in head:
        raise ConfigError(f"{flag} {path!r} is not a PEM file.")


def _check_engines(config: GatewayConfig) -> tuple[tuple[str, int], ...]:
    if not config.engines and not config.engine_dns:
        raise ConfigError(
            "--engine or --engine-dns is required at least once: the gateway needs an engine to forward to."
        )
    addresses = tuple(parse_address(text, "--engine") for text in config.engines)
    seen: dict[tuple[str, int], str] = {}
    for text, address in zip(config.engines, addresses, strict=True):
        if address in seen:
            raise ConfigError(f"--engine {text!r} is given twice (also as {seen[address]!r}).")
        seen[address] = text
        is_local = address[0] in _LOCAL_HOSTS or address[0] == config.host.lower()
        if config.port != 0 and address[1] == config.port and is_local:
            raise ConfigError(f"--engine {text!r} is the gateway's own --port; it cannot forward to itself.")
    return addresses


def _check_engine_dns(config: GatewayConfig) -> tuple[tuple[str, int], ...]:
    example = "NAME:PORT, such as dpgate-engine:50061"
    targets = tuple(parse_address(text, "--engine-dns", example) for text in config.engine_dns)
    for text, (name, _) in zip(config.engine_dns, targets, strict=True):
        if _DNS_NAME.fullmatch(name) is None:
            raise ConfigError(f"--engine-dns {text!r} must name a DNS name such as dpgate-engine:50061.")
    if len(set(targets)) != len(targets):
        raise ConfigError("--engine-dns names the same NAME:PORT twice.")
    _check_positive(config.engine_dns_interval_s, "--engine-dns-interval")
    return targets


def _check_dns_server(config: GatewayConfig) -> tuple[str, int] | None:
    if config.dns_server is None:
        return None
    if not config.engine_dns:
        raise ConfigError("--dns-server is only used by --engine-dns; give --engine-dns too.")
    host, port = parse_address(config.dns_server, "--dns-server", "IP:PORT, such as 10.96.0.10:53")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ConfigError(
            f"--dns-server {config.dns_server!r} must be an IP address and port, such as 10.96.0.10:53."
        ) from None
    return host, port


def _check_readiness(config: GatewayConfig) -> None:
    size = config.ready_data_parallel_size
    if size is None:
        return
    _check_at_least_one(size, "--data-parallel-size")
    if size > len(config.engines):
        raise ConfigError(
            f"--data-parallel-size {size} needs at least {size} engines to become ready, "
            f"but {len(config.engines)} are configured."
        )


def _check_tls(config: GatewayConfig) -> None:
    if (config.tls_cert_file is None) != (config.tls_key_file is None):
        raise ConfigError("--tls-cert and --tls-key must be given together.")
    if config.tls_client_ca_file is not None and config.tls_cert_file is None:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first.")
    for path, flag in (
        (config.tls_cert_file, "--tls-cert"),
        (config.tls_key_file, "--tls-key"),
        (config.tls_client_ca_file, "--tls-client-ca"),
    ):
        if path is not None:
            _check_pem_file(path, flag)
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        _check_tls_key(config.tls_cert_file, config.tls_key_file, config.tls_key_password)


def _check_tls_key(cert_file: str, key_file: str, password: str | None) -> None:
    """Load the pair now, so a wrong password or a key of another certificate fails at start."""

    def give_password() -> bytes:  # called by OpenSSL only for an encrypted key
        if password is None:
            raise ConfigError(f"--tls-key {key_file!r} is encrypted: give its password in {TLS_KEY_PASSWORD_ENV}.")
        return password.encode()

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file, password=give_password)
    except ssl.SSLError:
        raise ConfigError(
            f"--tls-key {key_file!r} does not load with --tls-cert {cert_file!r}: "
            f"a wrong {TLS_KEY_PASSWORD_ENV}, or a key of another certificate."
        ) from None


def _check_timing(config: GatewayConfig) -> None:
    if config.drain_grace_s < 0:
        raise ConfigError(f"--drain-grace {config.drain_grace_s} must be 0 or more.")
    _check_positive(config.shutdown_timeout_s, "--shutdown-timeout")
    if config.drain_grace_s >= config.shutdown_timeout_s:
        raise ConfigError(
            f"--drain-grace {config.drain_grace_s} must be shorter than --shutdown-timeout "
            f"{config.shutdown_timeout_s}, or in-flight calls get no time to finish."
        )
    _check_positive(config.health_interval_s, "--health-interval")
    _check_positive(config.health_timeout_s, "--health-timeout")
    if config.health_timeout_s > config.health_interval_s:
        raise ConfigError(
            f"--health-timeout {config.health_timeout_s} must not exceed --health-interval "
            f"{config.health_interval_s}, or probes overlap."
        )
    _check_at_least_one(config.failure_threshold, "--failure-threshold")
    _check_at_least_one(config.success_threshold, "--success-threshold")
    _check_at_least_one(config.breaker_failure_threshold, "--breaker-failure-threshold")
    _check_positive(config.breaker_open_s, "--breaker-open-seconds")
    _check_positive(config.keepalive_time_s, "--keepalive-time")
    _check_positive(config.keepalive_timeout_s, "--keepalive-timeout")
    _check_positive(config.min_client_ping_interval_s, "--min-client-ping-interval")


def _check_limits(config: GatewayConfig) -> None:
    if not 1 <= config.max_message_bytes <= MAX_MESSAGE_BYTES_LIMIT:
        raise ConfigError(f"--max-message-bytes {config.max_message_bytes} must be in 1..{MAX_MESSAGE_BYTES_LIMIT}.")
    if config.max_in_flight is not None:
        _check_at_least_one(config.max_in_flight, "--max-in-flight")
    if config.max_in_flight_per_peer is not None:
        _check_at_least_one(config.max_in_flight_per_peer, "--max-in-flight-per-peer")
    _check_positive(config.request_body_timeout_s, "--request-body-timeout")
    if config.policy not in POLICIES:
        raise ConfigError(f"--policy {config.policy!r} must be one of {sorted(POLICIES)}.")
    for flag, value in (
        ("--cache-prefill-weight", config.cache_prefill_weight),
        ("--cache-load-weight", config.cache_load_weight),
    ):
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"{flag} {value} must be a finite number of 0 or more.")
    if not (config.cache_balance_ratio >= 1 and math.isfinite(config.cache_balance_ratio)):
        raise ConfigError(f"--cache-balance-ratio {config.cache_balance_ratio} must be a finite number of 1 or more.")
    if config.cache_balance_slack < 0:
        raise ConfigError(f"--cache-balance-slack {config.cache_balance_slack} must be 0 or more.")
    if config.prefix_cache_sharing not in ("isolated", "shared"):
        raise ConfigError(f"--prefix-cache-sharing {config.prefix_cache_sharing!r} must be isolated or shared.")
    for key in config.api_keys:
        if not key or not key.isascii() or not key.isprintable() or " " in key:
            raise ConfigError("--api-key values must be non-empty printable ASCII without spaces.")


def _check_http2_limits(config: GatewayConfig) -> None:
    if not 1 <= config.max_concurrent_streams <= MAX_STREAMS_LIMIT:
        value = config.max_concurrent_streams
        raise ConfigError(f"--max-concurrent-streams {value} must be in 1..{MAX_STREAMS_LIMIT}.")
    low, high = HEADER_LIST_SIZE_RANGE
    if not low <= config.max_header_list_size <= high:
        raise ConfigError(f"--max-header-list-size {config.max_header_list_size} must be in {low}..{high}.")
    if not 0 <= config.hpack_table_size <= HPACK_TABLE_SIZE_LIMIT:
        raise ConfigError(f"--hpack-table-size {config.hpack_table_size} must be in 0..{HPACK_TABLE_SIZE_LIMIT}.")
    _check_at_least_one(config.max_connections, "--max-connections")
    _check_at_least_one(config.max_connections_per_peer, "--max-connections-per-peer")
    _check_at_least_one(config.max_continuation_frames, "--max-continuation-frames")
    _check_at_least_one(config.max_resets_per_second, "--max-resets-per-second")
    _check_positive(config.header_timeout_s, "--header-timeout")
    _check_positive(config.idle_timeout_s, "--idle-timeout")


def _check_http(config: GatewayConfig) -> None:
    if config.http_port is None:
        return
    _check_port(config.http_port, "--http-port", allow_zero=True)
    if config.http_port != 0:
        for port, flag in ((config.port, "--port"), (config.metrics_port, "--metrics-port")):
            if port == config.http_port:
                raise ConfigError(f"--http-port {config.http_port} must differ from {flag} {port}.")
    _check_at_least_one(config.http_max_body_bytes, "--http-max-body-bytes")
    low, high = HEADER_LIST_SIZE_RANGE
    if not low <= config.http_max_header_bytes <= high:
        raise ConfigError(f"--http-max-header-bytes {config.http_max_header_bytes} must be in {low}..{high}.")
    _check_at_least_one(config.http_max_connections, "--http-max-connections")
    _check_positive(config.http_idle_timeout_s, "--http-idle-timeout")


def validate_config(config: GatewayConfig) -> GatewayConfig:
    """Check every rule; return the config with parsed engine addresses, or raise ConfigError."""
    _check_port(config.port, "--port", allow_zero=True)
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format {config.log_format} must be one of {', '.join(LOG_FORMATS)}.")
    if config.metrics_port is not None:
        _check_port(config.metrics_port, "--metrics-port", allow_zero=True)
        if config.metrics_port == config.port and config.port != 0:
            raise ConfigError(f"--metrics-port {config.metrics_port} must differ from --port {config.port}.")
    _check_http(config)
    if not config.host:
        raise ConfigError("--host must not be empty.")
    addresses = _check_engines(config)
    dns_targets = _check_engine_dns(config)
    dns_server = _check_dns_server(config)
    _check_readiness(config)
    _check_tls(config)
    _check_timing(config)
    _check_limits(config)
    _check_http2_limits(config)
    return replace(config, engine_addresses=addresses, engine_dns_targets=dns_targets, dns_server_address=dns_server)


def read_api_key_file(path: str) -> tuple[str, ...]:
    """Keys from a file, one a line; blank lines and `#` comments skipped. Raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"--api-key-file {path!r} is not a readable UTF-8 file.") from None
    keys = tuple(line.strip() for line in lines if line.strip() and not line.strip().startswith("#"))
    if not keys:
        raise ConfigError(f"--api-key-file {path!r} holds no key.")
    return keys


def api_keys_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Keys from DPGATE_API_KEYS, separated by whitespace (a key holds none). Raises ConfigError.

    Set but empty is refused: it reads as "authentication on" while it would turn it off.
    """
    text = environ.get(API_KEYS_ENV)
    if text is None:
        return ()
    keys = tuple(text.split())
    if not keys:
        raise ConfigError(f"{API_KEYS_ENV} is set but holds no key.")
    if not all(key.isascii() and key.isprintable() for key in keys):
        raise ConfigError(f"{API_KEYS_ENV} must hold printable ASCII keys separated by whitespace.")
    return keys
