"""deploy/prometheus/alerts.yaml: promtool accepts it, every rule reads only what the gateway exports, and
every alert links to its section of docs/runbooks.md. The chart's copy (files/alerts.yaml, rendered as a
PrometheusRule: test_helm_rules.py) is the same file.

promtool is Debian's `prometheus` package (`make promtool-check` installs it); without it the
promtool tests skip and the structural tests still run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown.extensions.toc import slugify

from tests.helpers import ROOT
from tests.unit.deploy.deployfiles import DEPLOY
from tests.unit.deploy.promql import exported_metric_names, metric_names, promtool

pytestmark = pytest.mark.timeout(60)

ALERTS = DEPLOY / "prometheus/alerts.yaml"
CHART_ALERTS = DEPLOY / "helm/affinity-gateway/files/alerts.yaml"
RUNBOOKS = ROOT / "docs/runbooks.md"
RULES: list[dict[str, Any]] = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
BY_NAME = {r["alert"]: r for r in RULES}
SEVERITIES = {"critical", "warning", "info"}


def test_promtool_check_rules_passes() -> None:
    assert f"SUCCESS: {len(RULES)} rules found" in promtool("check", "rules", str(ALERTS))


def test_every_alert_fires_on_the_gateways_series_and_only_then() -> None:
    """alerts.test.yaml feeds each rule series shaped as the gateway exports them (promtool's rule tests)."""
    tested = set(re.findall(r"alertname: (\w+)", (DEPLOY / "prometheus/alerts.test.yaml").read_text()))
    assert tested == set(BY_NAME)
    assert "SUCCESS" in promtool("test", "rules", str(DEPLOY / "prometheus/alerts.test.yaml"))


def test_prometheus_config_with_the_rules_passes_promtool(tmp_path: Path) -> None:
    """deploy/prometheus.yml as compose mounts it: its rule_files path is the container's, so point it here."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yaml"]
    config["rule_files"] = [str(ALERTS)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert "SUCCESS" in promtool("check", "config", str(tmp_path / "prometheus.yml"))


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_alert_waits_has_a_severity_and_says_what_and_why(name: str) -> None:
    rule = BY_NAME[name]
    assert rule["for"] and rule["labels"]["severity"] in SEVERITIES
    assert rule["annotations"]["summary"].strip() and rule["annotations"]["description"].strip()


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_alert_reads_only_metrics_the_gateway_exports(name: str) -> None:
    used = metric_names(BY_NAME[name]["expr"])
    exported = exported_metric_names()
    assert used and used <= exported, f"not exported by the gateway: {sorted(used - exported)}"


@pytest.mark.parametrize(
    "condition,metric",
    [
        ("a pool without healthy replicas", "affinity_gateway_replica_healthy"),
        ("breaker open", "affinity_gateway_replica_breaker_state"),
        ("index degraded", "affinity_gateway_index_degraded"),
        ("KV feed out of sync", "affinity_gateway_kv_events_certain"),
        ("prediction error high", "affinity_gateway_route_ttft_error_seconds_bucket"),
        ("5xx ratio high", "affinity_gateway_requests_total"),
    ],
)
def test_every_condition_has_an_alert(condition: str, metric: str) -> None:
    assert any(metric in metric_names(r["expr"]) for r in RULES), condition


def runbook_anchors() -> dict[str, str]:
    """Heading text -> anchor of each section of docs/runbooks.md, slugged as the site's `toc` extension
    (Python-Markdown's default slugify, which mkdocs uses) makes its ids."""
    headings = re.findall(r"^## (.+)$", RUNBOOKS.read_text(), re.MULTILINE)
    return {h: slugify(h, "-") for h in headings}


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_alert_links_to_its_own_runbook_section(name: str) -> None:
    """The path is the page in the source tree; the anchor is its section's id on the built site too."""
    url = BY_NAME[name]["annotations"]["runbook_url"]
    assert url == f"docs/runbooks.md#{runbook_anchors()[name]}"


def test_the_runbooks_have_one_section_per_alert_and_nothing_else() -> None:
    assert sorted(runbook_anchors()) == sorted(BY_NAME)


def test_the_charts_rules_are_these_rules() -> None:
    """One source of the rules: the chart reads its copy (`.Files.Get` reads only files inside the chart;
    a symlink does not survive `helm package`)."""
    assert CHART_ALERTS.read_bytes() == ALERTS.read_bytes(), f"run: cp {ALERTS} {CHART_ALERTS}"
