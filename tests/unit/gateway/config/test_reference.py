"""The configuration reference is made from the config's classes: the docs page is what the command
prints today (stale: regenerate it), and the JSON Schema accepts config.example.yaml and refuses a
mistyped key."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from gateway.config.reference import json_schema, markdown
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(30)


def test_the_reference_page_is_what_the_command_prints() -> None:
    page = (ROOT / "docs" / "config-reference.md").read_text()
    assert page == markdown(), "stale: run `affinity-gateway config-reference > docs/config-reference.md`"


def test_every_key_of_the_example_is_in_the_reference() -> None:
    page = markdown()
    for section in (
        "## `pools.<model>.routing`",
        "## `pools.<model>.replicas[]`",
        "## `redis`",
        "## `pools.<model>.routing.params (prefix_affinity)`",
        "| `max_in_flight_per_replica` |",
    ):
        assert section in page


def test_the_json_schema_accepts_the_example_and_refuses_a_mistyped_key() -> None:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    example = yaml.safe_load((ROOT / "config.example.yaml").read_text())
    assert [error.message for error in validator.iter_errors(example)] == []
    wrong = {**example, "pool": {}, "listen": {"port": "${PORT:-8000}", "workers": "two"}}
    messages = sorted(error.message for error in validator.iter_errors(wrong))
    assert any("'pool' was unexpected" in m for m in messages) and any("'two'" in m for m in messages)
    assert not any("PORT" in m for m in messages)  # a variable may stand for a number
