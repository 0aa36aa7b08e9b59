"""The chart's PrometheusRule: off by default; on, it holds the rules of deploy/prometheus/alerts.yaml (the
chart's files/alerts.yaml is the same file: test_alerts.py) with each runbook_url on the documentation
site the values name, and promtool accepts its rules as Prometheus would load them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.promql import promtool
from tests.unit.deploy.test_alerts import ALERTS
from tests.unit.deploy.test_helm import render

pytestmark = pytest.mark.timeout(60)

BASE = "https://docs.example.com/affinity-gateway"


def prometheus_rules(overrides: dict[str, Any]) -> list[dict[str, Any]]:
    return [d for d in render(overrides) if d["kind"] == "PrometheusRule"]


def test_the_rules_link_each_alert_to_its_runbook_on_the_docs_site(tmp_path: Path) -> None:
    (rule,) = prometheus_rules(
        {"prometheusRule": {"enabled": True, "runbookBaseUrl": BASE + "/", "labels": {"release": "kps"}}}
    )
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    expected = yaml.safe_load(ALERTS.read_text())
    for group in expected["groups"]:
        for alert in group["rules"]:
            anchor = alert["annotations"]["runbook_url"].split("#")[1]
            alert["annotations"]["runbook_url"] = f"{BASE}/runbooks/#{anchor}"  # mkdocs' page URL
    assert rule["spec"] == expected  # the same rules, every expression and annotation intact
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    count = sum(len(group["rules"]) for group in expected["groups"])
    assert f"SUCCESS: {count} rules found" in promtool("check", "rules", str(tmp_path / "rules.yaml"))


def test_without_a_base_url_the_links_stay_the_pages_path() -> None:
    (rule,) = prometheus_rules({"prometheusRule": {"enabled": True}})
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"prometheusRule": {"runbookBaseUrl": BASE}},
        {"prometheusRule": {"enabled": True}, "gateway": {"enabled": False}},  # a replicas-only release
    ],
)
def test_no_rules_unless_enabled_with_the_gateways(overrides: dict[str, Any]) -> None:
    assert not prometheus_rules(overrides)
