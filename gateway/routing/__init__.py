"""Choosing a replica: the Router per pool, its policies (`policies/`, with the cost model), what it learns
of the replicas (`calibration`), the route table and its reload, the KV-event feeds, LoRA adapters.

Imports config, prompt, index (and its kv_events), replicas, observability, request, support; never
serving, admin, edge or relay.
"""
