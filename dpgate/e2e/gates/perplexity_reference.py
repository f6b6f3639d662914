"""The perplexity gate's reference: `transformers` on the same weights (a GGUF dequantized to
float32, as tests/engines/model/test_model_vs_transformers.py loads it), over the same windows.

Scoring a window is one float32 forward; its logits are taken in blocks of rows and reduced with
a float64 log_softmax, as the engine reduces its own, so a 262k vocabulary never needs a
[window, vocab] tensor at once. The result (sum of logprobs and count, per window) is cached in
the dpgate cache dir under a key of the model files' sha256, the windows' sha256 and the
transformers and torch versions: anything that could change it changes the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dpgate.cache_dir import dpgate_cache_dir
from dpgate.e2e.gates.perplexity_math import Window
from engines.model.source import ModelSource, SourceKind

LOGIT_ROWS = 128  # rows of logits reduced at once: 128 x 262k float64 is 256 MB at most


@dataclass(frozen=True, slots=True)
class ReferenceScores:
    """Per window, the sum of its scored tokens' natural-log probabilities; `cached` says whether
    they were read from the cache rather than computed now."""

    window_sums: tuple[float, ...]
    cached: bool

    @property
    def sum_logprob(self) -> float:
        return sum(self.window_sums)


def model_files_sha256(source: ModelSource) -> str:
    """One sha256 over the model's files: the GGUF, or a directory's config and weight files."""
    if source.kind is SourceKind.GGUF:
        paths = [source.path]
    else:
        paths = sorted(p for p in source.path.iterdir() if p.suffix in (".json", ".safetensors", ".bin"))
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def windows_sha256(windows: list[Window]) -> str:
    return hashlib.sha256(json.dumps([list(w.prompt) for w in windows]).encode()).hexdigest()


def cache_path(source: ModelSource, windows: list[Window]) -> Path:
    import torch
    import transformers

    key = f"{model_files_sha256(source)}|{windows_sha256(windows)}|{transformers.__version__}|{torch.__version__}"
    return dpgate_cache_dir() / "perplexity" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def reference_scores(source: ModelSource, windows: list[Window], use_cache: bool = True) -> ReferenceScores:
    path = cache_path(source, windows) if use_cache else None
    if path is not None and path.is_file():
        return ReferenceScores(tuple(json.loads(path.read_text())["window_sums"]), cached=True)
    model = load_reference_model(source)
    sums = tuple(score_window(model, window) for window in windows)
    if path is not None:
        write_atomically(path, json.dumps({"window_sums": sums}))
    return ReferenceScores(sums, cached=False)


def load_reference_model(source: ModelSource):
    import torch
    from transformers import AutoModelForCausalLM

    if source.kind is SourceKind.GGUF:
        path = source.path
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(source.path), dtype=torch.float32)
    return model.eval()


def score_window(model, window: Window) -> float:
    """Sum over the window's scored tokens of log p(token | tokens before it), natural log."""
    import torch

    ids = torch.tensor([window.prompt])
    softcap = getattr(model.config, "final_logit_softcapping", None)
    total = 0.0
    with torch.inference_mode():
        hidden = model.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0, :-1]
        targets = ids[0, 1:]
        for start in range(0, hidden.shape[0], LOGIT_ROWS):
            logits = model.lm_head(hidden[start : start + LOGIT_ROWS]).float()
            if softcap is not None:
                logits = torch.tanh(logits / softcap) * softcap
            logprobs = logits.double().log_softmax(-1)
            rows = targets[start : start + LOGIT_ROWS]
            total += float(logprobs.gather(1, rows[:, None]).sum())
    return total


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
