"""Whether a model splits into a topology's TP and DCP groups (its heads, KV heads and MLP width
divided as engines/parallel/plan.py requires), read from the model's config without torch.

A topology the model cannot split is the request's mistake, not the machine's nor dpgate's: a
single run refuses it as a bad flag (exit 2) and a matrix leaves it out, saying why, instead of
starting engines that would refuse it. A model that cannot be read is left to preflight, which
names that as infra.
"""

from __future__ import annotations

import functools
from typing import Any

from dpgate.e2e.contracts import Topology


@functools.cache
def _model_config(spec: str) -> Any | None:
    """The model's ModelConfig, or None if it cannot be read (read once per model: a matrix asks
    for each topology)."""
    from engines.model.config import UnsupportedModelError, read_model_config
    from engines.model.gguf_reader import GGUFFormatError
    from engines.model.source import ModelNotFoundError, resolve_model

    try:
        return read_model_config(resolve_model(spec))
    except (ModelNotFoundError, GGUFFormatError, UnsupportedModelError, OSError, ValueError):
        return None


def split_problem(topology: Topology) -> str | None:
    """The engine's own sentence for why `topology.model` does not split into TP x DCP, else None
    (also None when the model cannot be read here: preflight reports that)."""
    from engines.parallel.plan import ParallelConfigError, ParallelPlan

    if topology.tp == 1:
        return None  # one process holds every head
    config = _model_config(topology.model)
    if config is None:
        return None
    try:
        ParallelPlan(topology.tp, topology.dcp).check_model(config)
    except ParallelConfigError as error:
        return str(error)
    return None
