"""Runs compose.yaml's services as local processes, the way `docker compose up` would start them.

Each service's process is the image's ENTRYPOINT plus the service's `command`, with the image's
ENV and the service's `environment`. The ENTRYPOINT's program is resolved through pyproject.toml's
[project.scripts] (what `pip install` puts on the image's PATH) and run by this interpreter.

`localize` is the one place where anything is changed, and only what a single host forces:
- every host (a compose service name, 0.0.0.0, localhost) becomes 127.0.0.1, and
- every (service, container port) gets its own free port, because the services' containers each
  have their own network namespace and reuse port numbers that one host cannot.
The image's ENV entries that name paths inside the image (LOCAL_ONLY_ENV) keep the host's values.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.ops.container_files import (
    ROOT,
    ImageSpec,
    console_script,
    healthcheck_command,
    list_form,
    service_environment,
)
from tests.support.gateway_processes import free_port

LOCAL_HOSTS = ("0.0.0.0", "127.0.0.1", "localhost")
LOCAL_ONLY_ENV = ("PATH", "DPGATE_CACHE_DIR")
_ADDRESS = re.compile(r"^(\[[^\]]*\]|[A-Za-z0-9_.-]+):(\d+)$")
_PORT_FLAG = re.compile(r"^--([a-z-]+-)?port$")


class PortMap:
    """(service, container port) -> a free port on 127.0.0.1, picked on first use."""

    def __init__(self) -> None:
        self.ports: dict[tuple[str, int], int] = {}

    def __call__(self, service: str, port: int | str) -> int:
        key = (service, int(port))
        if key not in self.ports:
            self.ports[key] = free_port()
        return self.ports[key]


def _localize_value(service: str, flag: str | None, value: str, services: set[str], ports: PortMap) -> str:
    if flag == "--host":
        return "127.0.0.1"
    if flag is not None and _PORT_FLAG.match(flag) and value.isdigit():
        return str(ports(service, value))
    address = _ADDRESS.match(value)
    if address is not None:
        host, port = address.groups()
        if host in services:
            return f"127.0.0.1:{ports(host, port)}"
        if host in LOCAL_HOSTS:
            return f"127.0.0.1:{ports(service, port)}"
    return value


def localize(service: str, argv: list[str], services: set[str], ports: PortMap) -> list[str]:
    """`argv` of `service` with hosts and ports made local (see the module docstring)."""
    out: list[str] = []
    previous: str | None = None
    for word in argv:
        if word.startswith("--") and "=" in word:
            flag, _, value = word.partition("=")
            out.append(f"{flag}={_localize_value(service, flag, value, services, ports)}")
            previous = None
            continue
        is_value = previous is not None and not word.startswith("--")
        out.append(_localize_value(service, previous if is_value else None, word, services, ports))
        previous = word if word.startswith("--") else None
    return out


def program_argv(argv: list[str]) -> list[str]:
    """The image runs `argv[0]` from PATH; here the console script it names runs in this interpreter."""
    module, function = console_script(argv[0])
    code = f"import sys; from {module} import {function} as entry; sys.exit(entry())"
    return [sys.executable, "-c", code, *argv[1:]]


class LocalStack:
    """compose.yaml's default services (no profiles) as processes; stop() ends the ones it started."""

    def __init__(self, spec: ImageSpec, services: dict[str, dict], log_dir: Path) -> None:
        self.spec, self.log_dir = spec, log_dir
        self.services = {name: s for name, s in services.items() if not s.get("profiles")}
        self.ports = PortMap()
        self.processes: dict[str, subprocess.Popen] = {}

    def environment(self, name: str) -> dict[str, str]:
        image_env = {key: value for key, value in self.spec.env.items() if key not in LOCAL_ONLY_ENV}
        return {**os.environ, **image_env, **service_environment(self.services[name], name), "PYTHONPATH": str(ROOT)}

    def argv(self, name: str, command: list[str]) -> list[str]:
        return program_argv(localize(name, command, set(self.services), self.ports))

    def start(self, name: str) -> None:
        command = list_form(self.services[name].get("command"), f"compose service {name} command")
        log = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 (the child keeps it)
        argv = self.argv(name, [*self.spec.entrypoint, *command])
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.environment(name), cwd=ROOT
        )

    def healthcheck(self, name: str) -> subprocess.CompletedProcess[str]:
        """Run the service's own healthcheck command once."""
        argv = self.argv(name, healthcheck_command(self.services[name], name))
        return subprocess.run(argv, capture_output=True, text=True, env=self.environment(name), cwd=ROOT, timeout=30)

    def wait_healthy(self, name: str, timeout: float) -> None:
        """Poll the healthcheck (faster than its compose interval) until it exits 0."""
        deadline = time.monotonic() + timeout
        while True:
            if self.processes[name].poll() is not None:
                raise RuntimeError(f"{name} exited {self.processes[name].returncode}: {self.log_tail(name)}")
            result = self.healthcheck(name)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not healthy after {timeout}s: {result.stdout}{self.log_tail(name)}")
            time.sleep(0.2)

    def log_tail(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text()[-3000:]

    def start_order(self) -> list[list[str]]:
        """Waves of services: each wave's `depends_on` all lie in earlier waves."""
        waves: list[list[str]] = []
        done: set[str] = set()
        while len(done) < len(self.services):
            wave = [n for n, s in self.services.items() if n not in done and set(s.get("depends_on", {})) <= done]
            if not wave:
                raise ValueError(f"compose services depend on each other in a cycle: {set(self.services) - done}")
            waves.append(wave)
            done.update(wave)
        return waves

    def up(self, timeout: float) -> None:
        """Start wave by wave; a wave starts once every service before it passed its healthcheck."""
        for wave in self.start_order():
            for name in wave:
                conditions = self.services[name].get("depends_on", {})
                if isinstance(conditions, dict):
                    bad = {dep: c for dep, c in conditions.items() if c.get("condition") != "service_healthy"}
                    if bad:
                        raise ValueError(f"compose service {name}: this runner supports service_healthy only: {bad}")
                self.start(name)
            for name in wave:
                self.wait_healthy(name, timeout)

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@contextlib.contextmanager
def local_stack(spec: ImageSpec, services: dict[str, dict], log_dir: Path, timeout: float) -> Iterator[LocalStack]:
    stack = LocalStack(spec, services, log_dir)
    try:
        stack.up(timeout)
        yield stack
    finally:
        stack.stop()
