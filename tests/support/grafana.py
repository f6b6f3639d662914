"""The dashboard in deploy/grafana/, read as the tests need it."""

from __future__ import annotations

import json
from pathlib import Path

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"


def dashboard() -> dict:
    return json.loads((GRAFANA / "dpgate.json").read_text())


def panel_queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows' nested panels included."""
    queries = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            queries += [(inner["title"], target["expr"]) for target in inner.get("targets", [])]
    return queries
