"""Bounds on grammar work, in a module of their own so the engine's flags can name them without
importing the compiler (and, through it, xgrammar)."""

from __future__ import annotations

# --grammar-compile-timeout-s: a typical schema compiles in 0.02-0.5 s on 2 cores; a JSON schema
# nesting arrays 400 deep took 5.7 s to convert, 900 deep 59 s (issue 22).
DEFAULT_COMPILE_BUDGET_S = 10.0
