"""bench/ is a folder of scripts, not a package: its modules import each other by bare name
(`from report_ratios import ...`), as they do when run as `python bench/report.py`."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
