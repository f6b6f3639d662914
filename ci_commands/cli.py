"""Command line: ``python -m ci_commands --event PATH`` (Actions) or ``--serve PORT`` (webhooks).

Tokens come only from the environment (GITHUB_TOKEN, BUILDKITE_TOKEN, and the webhook secret
CI_COMMANDS_WEBHOOK_SECRET) so they never appear in process listings; everything else may be
given as a flag or an environment variable, flags winning, so tests can point the API base
URLs at a local fake server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence

from ci_commands import buildkite, github
from ci_commands.actions import Target
from ci_commands.authorize import Policy
from ci_commands.dispatch import Outcome, Services, handle
from ci_commands.event import parse_event
from ci_commands.ownership import DEFAULT_PR_META_KEY
from ci_commands.webhook import make_receiver

EXIT_CODES: Mapping[Outcome, int] = {
    Outcome.IGNORED: 0,
    Outcome.DUPLICATE: 0,
    Outcome.REFUSED: 0,
    Outcome.DONE: 0,
    Outcome.FAILED: 1,
}
"""A refusal is the tool working as intended; only a failed Buildkite call marks the run red."""


class ConfigError(Exception):
    """A required setting is missing; reported and exit status 2."""


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    summary = __doc__.splitlines()[0] if __doc__ else None  # docstrings vanish under -OO
    parser = argparse.ArgumentParser(prog="python -m ci_commands", description=summary)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--event", metavar="PATH", help="issue_comment event payload (GITHUB_EVENT_PATH)")
    mode.add_argument("--serve", metavar="PORT", type=int, help="receive signed webhooks on this port")
    parser.add_argument("--host", default="127.0.0.1", help="address for --serve (default 127.0.0.1)")
    parser.add_argument("--github-api", default=env.get("GITHUB_API_URL", github.DEFAULT_API_URL))
    parser.add_argument("--buildkite-api", default=env.get("BUILDKITE_API_URL", buildkite.DEFAULT_API_URL))
    parser.add_argument(
        "--organization", default=env.get("BUILDKITE_ORGANIZATION"), help="Buildkite org slug"
    )
    parser.add_argument("--pipeline", default=env.get("BUILDKITE_PIPELINE"), help="Buildkite pipeline slug")
    parser.add_argument(
        "--trusted-users",
        default=env.get("CI_TRUSTED_USERS", ""),
        help="comma- or space-separated logins that may run any command",
    )
    parser.add_argument("--ready-label", default=env.get("CI_READY_LABEL", "ready"))
    parser.add_argument("--pr-meta-key", default=env.get("CI_PR_META_KEY", DEFAULT_PR_META_KEY))
    return parser


def services_from(args: argparse.Namespace, env: Mapping[str, str]) -> Services:
    """Assemble clients and policy, naming every missing setting at once."""
    missing = [name for name in ("GITHUB_TOKEN", "BUILDKITE_TOKEN") if not env.get(name)]
    missing += [f"--{name}" for name in ("organization", "pipeline") if not getattr(args, name)]
    if missing:
        raise ConfigError("missing settings: " + ", ".join(missing))
    trusted = frozenset(login for login in args.trusted_users.replace(",", " ").split() if login)
    return Services(
        github=github.GitHubClient.create(env["GITHUB_TOKEN"], args.github_api),
        target=Target(
            buildkite=buildkite.BuildkiteClient.create(
                env["BUILDKITE_TOKEN"], args.organization, args.buildkite_api
            ),
            pipeline=args.pipeline,
            meta_key=args.pr_meta_key,
        ),
        policy=Policy(trusted_users=trusted, ready_label=args.ready_label),
    )


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    args = build_parser(env).parse_args(argv)
    try:
        services = services_from(args, env)
        if args.serve is not None:
            return _serve(args, env, services)
    except ConfigError as error:
        print(f"ci_commands: {error}", file=sys.stderr)
        return 2
    try:
        payload = _read_event(args.event)
        event = parse_event(payload)  # malformed payloads stop here, before any API call
    except (OSError, ValueError) as error:
        print(f"ci_commands: cannot use event {args.event}: {error}", file=sys.stderr)
        return 2
    outcome = handle(payload, services) if event is not None else Outcome.IGNORED
    print(f"ci_commands: {outcome.name.lower()}: {outcome.value}")
    return EXIT_CODES[outcome]


def _read_event(path: str) -> Mapping[str, object]:
    """Read the payload; JSON and shape errors become ValueError, before any API call."""
    with open(path, encoding="utf-8") as file:
        payload = json.load(file)
    if not isinstance(payload, dict):
        raise ValueError("the payload is not a JSON object")
    return payload


def _serve(args: argparse.Namespace, env: Mapping[str, str], services: Services) -> int:
    secret = env.get("CI_COMMANDS_WEBHOOK_SECRET", "")
    if not secret:
        raise ConfigError("missing settings: CI_COMMANDS_WEBHOOK_SECRET")
    server = make_receiver(secret.encode(), lambda payload: handle(payload, services), args.host, args.serve)
    print(f"ci_commands: receiving webhooks on {args.host}:{server.server_address[1]}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
