"""deploy/grafana: the dashboard picks its Prometheus by variable and queries only what the gateway exports.

A hard-coded datasource uid breaks the import on any Grafana but the compose one, and a query naming
a metric the gateway does not export is a panel that stays empty without telling anyone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.deployfiles import DEPLOY
from tests.unit.deploy.promql import exported_metric_names, metric_names, promtool

DASHBOARD = json.loads((DEPLOY / "grafana/dashboards/affinity-gateway.json").read_text())
PANELS = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
VARIABLES = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def exprs() -> list[str]:
    """The panels' PromQL and the series selectors of the variables' `label_values(selector, label)`."""
    selectors = [
        re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["query"]["query"])
        for v in VARIABLES.values()
        if v["type"] == "query"
    ]
    return [t["expr"] for p in PANELS for t in p["targets"]] + selectors


def test_the_datasource_is_a_prometheus_variable_and_every_panel_and_query_uses_it() -> None:
    assert VARIABLES["datasource"]["type"] == "datasource" and VARIABLES["datasource"]["query"] == "prometheus"
    users = [
        *PANELS,
        *(t for p in PANELS for t in p["targets"]),
        *(v for v in VARIABLES.values() if v["type"] == "query"),
    ]
    assert PANELS and all(u["datasource"] == DATASOURCE for u in users)


def test_no_datasource_uid_is_hard_coded_anywhere() -> None:
    uids = re.findall(r'"uid":\s*"([^"]*)"', json.dumps(DASHBOARD))
    assert set(uids) == {DASHBOARD["uid"], "${datasource}"}
    assert uids.count(DASHBOARD["uid"]) == 1  # the dashboard's own uid, nothing else


@pytest.mark.parametrize("name,label", [("model", "model_name"), ("replica", "replica")])
def test_model_and_replica_variables_filter_the_queries(name: str, label: str) -> None:
    variable = VARIABLES[name]
    assert variable["type"] == "query" and variable["multi"] and variable["includeAll"]
    assert re.fullmatch(rf"label_values\(\w+(\{{[^}}]*\}})?, {label}\)", variable["query"]["query"])
    assert any(f'{label}=~"${name}"' in t["expr"] for p in PANELS for t in p["targets"])


def test_queries_name_only_metrics_the_gateway_exports() -> None:
    exported = exported_metric_names()
    used = {name for e in exprs() for name in metric_names(e)}
    assert used and used <= exported, f"not exported by the gateway: {sorted(used - exported)}"


@pytest.mark.parametrize(
    "topic,metrics",
    [
        ("request rate, 4xx/5xx", {"affinity_gateway_requests_total"}),
        (
            "TTFT and time to complete",
            {"affinity_gateway_ttft_seconds_bucket", "affinity_gateway_request_duration_seconds_bucket"},
        ),
        ("queue and admission", {"affinity_gateway_queue_waiting", "affinity_gateway_queue_wait_seconds_bucket"}),
        ("breaker state", {"affinity_gateway_replica_breaker_state"}),
        ("rate-limit rejections", {"affinity_gateway_rejected_total"}),
        ("evidence mix", {"affinity_gateway_route_evidence_total"}),
        (
            "prediction error",
            {
                "affinity_gateway_route_ttft_error_seconds_bucket",
                "affinity_gateway_route_cached_tokens_error_tokens_bucket",
            },
        ),
        ("KV-event sync", {"affinity_gateway_kv_events_certain", "affinity_gateway_kv_events_gaps_total"}),
    ],
)
def test_every_topic_has_a_panel(topic: str, metrics: set[str]) -> None:
    used = {name for e in exprs() for name in metric_names(e)}
    assert metrics <= used, topic


def test_quantiles_come_from_bucket_series_and_rates_from_counters() -> None:
    for expr in exprs():
        for quantile in re.findall(r"histogram_quantile\(([^,]+), (.*)", expr):
            assert all(n.endswith("_bucket") for n in metric_names(quantile[1])), expr
        for inner in re.findall(r"\b(?:rate|increase)\((\w+)", expr):
            assert inner.endswith(("_total", "_bucket")), expr


def test_panels_do_not_overlap() -> None:
    cells: set[tuple[int, int]] = set()
    for panel in DASHBOARD["panels"]:
        grid: dict[str, Any] = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        x, y, w, h = grid["x"], grid["y"], grid["w"], grid["h"]
        area = {(col, row) for col in range(x, x + w) for row in range(y, y + h)}
        assert not area & cells, panel["title"]
        cells |= area


def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule, with Grafana's variables as they expand."""
    expand = {"$__rate_interval": "1m", "$model": ".*", "$replica": ".*"}
    queries = [t["expr"] for p in PANELS for t in p["targets"]]
    for variable, value in expand.items():
        queries = [q.replace(variable, value) for q in queries]
    assert not [q for q in queries if "$" in q]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries)],
            }
        ]
    }
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(queries)} rules found" in promtool("check", "rules", str(tmp_path / "queries.yaml"))


def test_the_name_reader_skips_functions_labels_strings_and_durations() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (pool, le) (rate(a_bucket{pool=~"x(y)", le!="1"}[$__rate_interval])))'
        " / on (pool) group_left max without (job) (b) > bool 0.5 or count(c offset 5m)"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c"}
