"""Engines execute scheduler steps: `base` (the protocol), `simulated`, `timing` (its cost model), `registry`."""
