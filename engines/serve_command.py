"""`dpgate serve`: the quick start, one engine with the default model on 127.0.0.1:50051."""

from __future__ import annotations

import argparse

from engines import engine_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_command.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return engine_command.run(args)
