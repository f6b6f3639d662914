"""`dpgate engine`: run one engine process."""

from __future__ import annotations

import argparse
import asyncio
import sys

from dpgate.config_file import attribute
from dpgate.logs import configure_logging
from engines.config import ConfigError, EngineConfig, add_engine_arguments
from engines.model.config import UnsupportedModelError
from engines.model.gguf_reader import GGUFFormatError
from engines.model.numerics import NumericsError
from engines.model.source import ModelNotFoundError

# Start-up errors that are the user's to fix: one sentence, exit status 2.
USER_ERRORS = (ConfigError, ModelNotFoundError, GGUFFormatError, UnsupportedModelError, NumericsError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = EngineConfig.from_args(args)
        configure_logging(config.log_format)
        config.validate()
        import uvloop

        from engines.serving.server import serve

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(serve(config))
    except USER_ERRORS as error:
        print(f"dpgate engine: {attribute(str(error), args)}", file=sys.stderr)
        return 2
