"""`--kernel-isa`: a cap on the batch-invariant kernels' instruction set, applied to what the CPU runs."""

from __future__ import annotations

import pytest

from engines.config import ConfigError, EngineConfig
from engines.model.source import resolve_model
from engines.serving.server import capped_isas, numerics_for

ZEN4 = ("scalar", "avx2", "avx512", "avx512_vnni")


def test_auto_keeps_every_set_the_cpu_runs():
    assert capped_isas(ZEN4, "auto") == ZEN4


@pytest.mark.parametrize(
    ("cap", "kept"),
    [("avx512", ("scalar", "avx2", "avx512")), ("avx2", ("scalar", "avx2")), ("scalar", ("scalar",))],
)
def test_a_cap_drops_the_sets_above_it(cap, kept):
    assert capped_isas(ZEN4, cap) == kept


def test_a_cap_the_cpu_cannot_run_is_refused_naming_what_it_runs():
    with pytest.raises(ConfigError, match=r"^--kernel-isa avx512_vnni: this CPU's kernels run scalar, avx2$"):
        capped_isas(("scalar", "avx2"), "avx512_vnni")


@pytest.mark.e2e  # loads the kernel library (its build checks g++)
def test_the_served_numerics_use_the_cap_and_say_so():
    source = resolve_model("smollm2-135m-instruct")
    capped = numerics_for(EngineConfig(kernel_isa="avx2"), source)
    assert capped.isa == "avx2" and capped.reason.endswith("; --kernel-isa avx2")
    assert numerics_for(EngineConfig(kernel_isa="scalar"), source).kernels == "batch-invariant/scalar"
    assert "--kernel-isa" not in numerics_for(EngineConfig(), source).reason
