"""Serving apart from the lab: importing the gateway's serving modules loads neither the replica stub
(the product's test double) nor `lab` (simulator, bench, local cluster), nor httpx (the tests'
HTTP client, a dev dependency only: a plain install has none). A fresh interpreter, so nothing the test
session imported earlier hides a stray import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(60)

IMPORT_SERVING = """
import contextlib, importlib, io, json, pkgutil, sys
import gateway

def lab_or_main(name):
    return name == "gateway.__main__" or name == "lab" or name.startswith("lab.")

def serving(package):
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if not lab_or_main(info.name):
            module = importlib.import_module(info.name)
            yield info.name
            if info.ispkg:
                yield from serving(module)

imported = list(serving(gateway))
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    importlib.import_module("gateway.cli.main").main(["serve", "--help"])  # the serving command's parser too
loaded = sorted(n for n in sys.modules if n.split(".")[0] in ("replica_stub", "httpx") or lab_or_main(n))
print(json.dumps({"serving": imported, "loaded": loaded}))
"""


def test_serving_modules_import_no_stub_no_lab_and_no_dev_dependency() -> None:
    out = subprocess.run([sys.executable, "-c", IMPORT_SERVING], capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert {"gateway.serving.app", "gateway.cli.main", "gateway.prompt.tokenizers"} <= set(report["serving"])
    assert report["loaded"] == []
