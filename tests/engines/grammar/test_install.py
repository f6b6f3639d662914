"""xgrammar is installed with --no-deps (dev.sh): its wheel declares triton, about 1 GB used only
for CUDA tensors. This proves the install is honest: every other dependency it declares is
installed at a version it accepts, and everything dpgate uses of it works without triton."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

XGRAMMAR_VERSION = "0.2.9"
LEFT_OUT = {"triton"}  # CUDA kernels only; dpgate applies masks to CPU tensors


def test_xgrammar_is_the_pinned_release():
    assert importlib.metadata.version("xgrammar") == XGRAMMAR_VERSION


def test_every_runtime_dependency_xgrammar_declares_is_installed_except_triton():
    checked = []
    for line in importlib.metadata.requires("xgrammar"):
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra (test, metal) or another platform
        if requirement.name in LEFT_OUT:
            continue
        installed = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement} but {installed} is installed"
        )
        checked.append(requirement.name)
    assert {"apache-tvm-ffi", "pydantic", "torch", "transformers", "numpy", "typing-extensions"} <= set(checked)


def test_triton_is_not_installed():
    try:
        importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return
    raise AssertionError("triton is installed; dev.sh installs xgrammar without it")


# Everything dpgate calls in xgrammar (vocabulary, every compile kind, matcher with override stop
# tokens, accept, rollback, fill, the CPU mask kernel, termination), in a fresh interpreter so
# nothing else can have loaded triton first.
USES = r"""
import sys
import torch
from engines.grammar.bitmask import MaskBuffers, mask_constrained_rows
from engines.grammar.compiler import GrammarCompiler
from engines.grammar.matcher import RequestGrammar
from engines.grammar.spec import choice_spec, ebnf_spec, json_object_spec, json_schema_spec, regex_spec
from engines.model.source import resolve_model
from engines.model.tokenizer import load_tokenizer

tokenizer = load_tokenizer(resolve_model("smollm2-135m-instruct")).tokenizer
a, b = tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("b")
compiler = GrammarCompiler(tokenizer, 49152, frozenset({2}))
specs = [json_schema_spec('{"type": "string"}'), json_object_spec(), regex_spec("ab"), ebnf_spec('root ::= "a"'),
         choice_spec(["a"])]
grammars = [RequestGrammar(compiler.submit(spec).result(), frozenset({2, b}), 49152) for spec in specs]


class Seq:  # what mask_constrained_rows reads of a sequence
    def __init__(self, grammar, output_ids):
        self.grammar, self.output_ids, self.blocked_token_ids = grammar, output_ids, []
        self.stopping = type("Stopping", (), {"min_tokens": 0})()


outputs = [[], [], [a], [a], []]
masked = mask_constrained_rows(torch.zeros(5, 49152), [Seq(g, o) for g, o in zip(grammars, outputs)], MaskBuffers())
assert list(masked.conflicts) == [2], masked.conflicts  # "ab" needs "b", a stop token here
assert torch.isneginf(masked.logits[masked.index[4]][b]) and masked.logits[masked.index[3]][2] == 0
grammars[3].accept(2)
assert grammars[3].is_terminated
grammars[3].sync([])  # rollback
assert not grammars[3].is_terminated
assert "triton" not in sys.modules, "xgrammar loaded triton"
print("ok")
"""


@pytest.mark.e2e
def test_everything_dpgate_uses_of_xgrammar_works_without_triton():
    done = subprocess.run([sys.executable, "-c", USES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
