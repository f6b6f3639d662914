"""atheris on the HTTP/2 fuzz target: `python -m tests.gateway.http2.fuzz_main -runs=N [CORPUS_DIR]`.

Only the code under test is instrumented for coverage (the HTTP/2 layer, the front door, the
upstream side, hpack), so libFuzzer steers toward their branches and start-up stays quick.
An input that breaks a rule ends the run with the traceback and a crash file (libFuzzer's
`-artifact_prefix` says where).
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["gateway.http2", "gateway.front_door", "gateway.upstream", "hpack"]):
    from tests.gateway.http2.fuzz_target import run_input


def main() -> None:
    atheris.Setup(sys.argv, run_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
