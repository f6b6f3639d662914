"""The one place dpgate keeps files it derives from models (converted tokenizers, GGUFs assembled
from parts): $DPGATE_CACHE_DIR, else $XDG_CACHE_HOME/dpgate, else ~/.cache/dpgate."""

from __future__ import annotations

import os
from pathlib import Path


def dpgate_cache_dir() -> Path:
    explicit = os.environ.get("DPGATE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dpgate"
