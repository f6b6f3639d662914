"""Loading a model on a named kernel family for tests that compare the two."""

from __future__ import annotations

import torch

from engines import kernels
from engines.kernels.cpu import cpu_info
from engines.model.numerics import choose_numerics
from engines.model.source import ModelSource
from engines.runner.loader import LoadedModel, apply_numerics, load


def load_with_kernels(source: ModelSource, kernel_family: str, dtype: str = "float32", quantization: str = "none"):
    """`kernel_family` "torch": the model as loaded (torch's modules); "batch-invariant": the
    kernels on this CPU's fastest instruction set, with the given dtype and weight storage."""
    if kernel_family == "torch":
        return load(source, getattr(torch, dtype))
    return on_kernels(load(source, getattr(torch, dtype)), dtype, quantization)


def on_kernels(loaded: LoadedModel, dtype: str = "float32", quantization: str = "none") -> LoadedModel:
    numerics = choose_numerics(dtype, quantization, True, cpu_info(), kernels.supported_isas())
    return apply_numerics(loaded, numerics)
