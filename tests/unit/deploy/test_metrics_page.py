"""docs/metrics.md names every series the gateway exports, with its type, and nothing else: the page's
tables against the registry of an app built for the compose config (every feature there on)."""

from __future__ import annotations

import re

import pytest

from gateway.config.loader import load_config
from gateway.serving.app import make_app
from gateway.serving.app_keys import METRICS
from tests.helpers import ROOT
from tests.unit.deploy.deployfiles import DEPLOY

pytestmark = pytest.mark.timeout(30)

_ROW = re.compile(r"^\| `(affinity_gateway_\w+)` \| (\w+) \| ([^|]*) \|", re.M)


def documented() -> dict[str, tuple[str, list[str]]]:
    """family name (a counter's without `_total`) -> (type, labels) from the page's tables."""
    rows = {}
    for name, kind, labels in _ROW.findall((ROOT / "docs" / "metrics.md").read_text()):
        family = name.removesuffix("_total") if kind == "counter" else name
        rows[family] = (kind, sorted(re.findall(r"`(\w+)`", labels)))
    return rows


def test_the_metrics_page_and_the_registry_name_the_same_series_of_the_same_types() -> None:
    families = list(make_app(load_config(DEPLOY / "gateway.yaml"))[METRICS].registry.collect())
    exported = {family.name: family for family in families}
    page = documented()
    assert sorted(set(page) - set(exported)) == [], "on the page, not exported"
    assert sorted(set(exported) - set(page)) == [], "exported, not on the page"
    for name, family in exported.items():
        assert family.type == page[name][0], name
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        if labels:  # families read at scrape time carry samples: their labels too
            assert sorted(labels) == page[name][1], name
