"""deploy/grafana: the dashboard is well-formed, every query is valid PromQL (promtool), and the
PromQL name reader the live check relies on finds what it must (tests/gateway/test_observability_e2e.py
checks the names against the processes' real /metrics)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.grafana import GRAFANA, dashboard, panel_queries
from tests.support.promql import exposed_names, metric_names
from tests.support.promtool import promtool


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("sum by (code) (rate(dpgate_gateway_requests_total[$__rate_interval]))", {"dpgate_gateway_requests_total"}),
        ('histogram_quantile(0.9, sum by (le) (rate(a_bucket{rpc=~"Gen|x{1}"}[5m] offset 1h)))', {"a_bucket"}),
        ("max by (r) (a * on (instance) group_left (r) b_info) > bool 0.5", {"a", "b_info"}),
        ("max_over_time(a[1h:5m]) and ignoring (x) b unless c or 1e3", {"a", "b", "c"}),
    ],
)
def test_metric_names_reads_only_metrics(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_exposed_names_include_the_names_a_type_line_promises() -> None:
    text = '# TYPE h histogram\n# TYPE c counter\n# TYPE g gauge\ng{a="1"} 2.0\nc_total 1.0\n'
    assert exposed_names(text) == {"h_bucket", "h_sum", "h_count", "h_created", "c_total", "c_created", "g"}


def test_every_panel_has_queries_on_the_datasource_variable() -> None:
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert [v["name"] for v in board["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(target["datasource"]["uid"] == "${datasource}" for target in panel["targets"]), panel["title"]


@pytest.mark.e2e
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression ($__rate_interval is Grafana's)."""
    rules = [
        {"record": f"dpgate:panel_query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, (_, expr) in enumerate(panel_queries(dashboard()))
    ]
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_provisioning_names_the_prometheus_datasource_and_the_dashboard_folder() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert [(s["name"], s["type"]) for s in sources["datasources"]] == [("Prometheus", "prometheus")]
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "dpgate.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/dpgate"
    assert dashboard()["templating"]["list"][0]["current"]["value"] == sources["datasources"][0]["name"]
