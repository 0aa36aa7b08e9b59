"""The metric names a PromQL expression reads, and the names the gateway really exports.

The exported set comes from the registry of an app built by `make_app` for the compose config, so a
metric renamed or dropped in the code fails the dashboard and alert tests instead of going blank.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gateway.config.loader import load_config
from gateway.serving.app import make_app
from gateway.serving.app_keys import METRICS
from tests.unit.deploy.deployfiles import DEPLOY

# What each family type puts on the wire (prometheus_client's exposition, OpenMetrics `_created` too).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
}


def exported_metric_names() -> set[str]:
    """Every series name the gateway's /metrics can carry, read from its real registry."""
    app = make_app(load_config(DEPLOY / "gateway.yaml"))
    names: set[str] = set()
    for family in app[METRICS].registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals first: they may hold any character
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w$:.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, call = match.groups()
        if not call and word not in _KEYWORDS | _AGGREGATIONS:
            names.add(word)
    return names


def promtool(*args: str) -> str:
    """promtool's output; the calling test skips where it is not installed, fails where it says no."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool not found: `make promtool-check` installs it (Debian package prometheus)")
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
