"""deploy/helm/affinity-gateway/values.schema.json, generated from values.yaml: every value's type from its
default, no key that values.yaml does not declare (a misspelt value fails `helm install` instead of being
ignored), enums and item shapes where the templates need them. The free-form maps (resources, labels,
annotations) take anything. `gateway.config`, merged over the generated config, is checked by the gateway's
own config schema (`gateway.config.reference.json_schema`) with nothing required, so a misspelt key of it
fails at install time too; `pool.policy` and `extraPools[].policy` name one of the gateway's policies.

    .venv/bin/python -m tests.unit.deploy.values_schema   # rewrite the schema after changing values.yaml
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gateway.config.policy_params import POLICY_CONFIGS
from gateway.config.reference import json_schema

CHART = Path(__file__).resolve().parents[3] / "deploy/helm/affinity-gateway"
FREE_FORM = {"resources", "annotations", "labels", "podAnnotations", "nodeSelector", "affinity"}
POLICIES = list(POLICY_CONFIGS)
ENUMS = {
    "pool.policy": POLICIES,
    "replicas.mode": ["stub", "vllm"],
    "discovery.mode": ["dns", "kubernetes"],
    "gateway.logLevel": ["debug", "info", "warning", "error"],
}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
ITEMS: dict[str, dict[str, Any]] = {
    "auth.files": {
        "type": "object",
        "required": ["key"],
        "additionalProperties": False,
        "properties": {
            "key": {"type": "string", "minLength": 1},
            "tenant": {"type": "string"},
            "admin": {"type": "boolean"},
            "requestsPerMinute": {"type": "number", "minimum": 0},
            "tokensPerMinute": {"type": "number", "minimum": 0},
        },
    },
    "extraPools": {
        "type": "object",
        "required": ["name", "service"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "service": {"type": "string", "minLength": 1},
            "port": _PORT,
            "policy": {"enum": POLICIES},
            "blockTokens": {"type": "integer", "minimum": 1},
            "tokenizer": {"type": "string"},
            "kvEvents": {
                "type": "object",
                "required": ["port", "replayPort"],
                "additionalProperties": False,
                "properties": {"port": _PORT, "replayPort": _PORT},
            },
        },
    },
    "ingress.hosts": {
        "type": "object",
        "required": ["host", "paths"],
        "additionalProperties": False,
        "properties": {
            "host": {"type": "string"},
            "paths": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["path", "pathType"],
                    "additionalProperties": False,
                    "properties": {
                        "path": {"type": "string"},
                        "pathType": {"enum": ["Prefix", "Exact", "ImplementationSpecific"]},
                    },
                },
            },
        },
    },
}


def partial(schema: Any) -> Any:
    """`schema` with no `required` anywhere: `gateway.config` is merged over a complete config, so any
    part of it may be left out, while a key that is there must still be known and of the right type."""
    if isinstance(schema, dict):
        return {k: partial(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [partial(v) for v in schema]
    return schema


def gateway_config_schema() -> dict[str, Any]:
    """The gateway's config schema (draft 2020-12) as a part of the values schema (which Helm reads with
    draft-07 semantics): it uses only keywords both drafts read alike, and its `$schema` and `title` go,
    since they belong to a document's root."""
    own = partial({k: v for k, v in json_schema().items() if k not in ("$schema", "title")})
    routing = own["properties"]["pools"]["additionalProperties"]["properties"]["routing"]["properties"]
    variable = {"type": "string", "pattern": r"\$\{"}  # `${VAR}`, read when the gateway loads it
    routing["policy"] = {**routing["policy"], "type": "string", "anyOf": [{"enum": POLICIES}, variable]}
    return {**own, "description": "gateway YAML merged over the generated config"}


def schema_of(value: Any, path: str) -> dict[str, Any]:
    """The schema of one value of values.yaml, by its default and its dotted path."""
    name = path.rsplit(".", 1)[-1]
    if path in ENUMS:
        return {"enum": ENUMS[path]}
    if path == "gateway.config":
        return gateway_config_schema()
    if name in FREE_FORM:
        return (
            {"type": "object"}
            if name not in ("annotations", "labels", "podAnnotations", "nodeSelector")
            else _STRING_MAP
        )
    if isinstance(value, dict):
        return {
            "type": "object",
            "additionalProperties": not value,
            "properties": {k: schema_of(v, f"{path}.{k}" if path else k) for k, v in value.items()},
        }
    if isinstance(value, list):
        return {"type": "array", **({"items": ITEMS[path]} if path in ITEMS else {})}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int) and not name.endswith("S"):  # readyDelayS, graceS...: seconds may be fractional
        return {"type": "integer", "minimum": 0}
    if isinstance(value, (int, float)):
        return {"type": "number", "minimum": 0, **({"maximum": 1} if name in ("samplingRatio",) else {})}
    return {"type": "string"}


def schema() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "affinity-gateway chart values",
        **schema_of(values, ""),
    }


def text() -> str:
    return json.dumps(schema(), indent=2) + "\n"


if __name__ == "__main__":
    (CHART / "values.schema.json").write_text(text())
