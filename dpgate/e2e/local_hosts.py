"""LocalHosts: every host is this machine's loopback, so a run needs no privileges; and
`make_hosts`, the one place a `--hosts` value becomes a Hosts object."""

from __future__ import annotations

import importlib

from dpgate.e2e.contracts import Hosts, HostsUnavailable

LOOPBACK = "127.0.0.1"
HOST_KINDS = ("local", "netns")


class LocalHosts:
    """Hosts on 127.0.0.1: commands run as they are and no link can be cut."""

    kind = "local"

    def setup(self, names: list[str]) -> None:
        self.names = list(names)

    def address(self, name: str) -> str:
        return LOOPBACK

    def command(self, name: str, argv: list[str]) -> list[str]:
        return list(argv)

    def cut(self, name: str) -> None:
        raise HostsUnavailable("local hosts share the loopback: a link cannot be cut (use --hosts netns)")

    def heal(self, name: str) -> None:
        raise HostsUnavailable("local hosts share the loopback: there is no link to heal (use --hosts netns)")

    def teardown(self) -> None:
        """Nothing was made."""


def make_hosts(kind: str) -> Hosts:
    """The Hosts for `--hosts KIND`; raises HostsUnavailable when that placement is not installed."""
    if kind == "local":
        return LocalHosts()
    if kind == "netns":
        try:
            module = importlib.import_module("dpgate.e2e.netns")
        except ImportError as error:
            raise HostsUnavailable(f"--hosts netns: dpgate.e2e.netns cannot be imported ({error})") from error
        return module.NetnsHosts()
    raise ValueError(f"--hosts {kind} must be one of {', '.join(HOST_KINDS)}")
