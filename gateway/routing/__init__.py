"""Choosing a replica: the Router per pool, its policies (`policies/`), the cost model, the route table
and its reload, model names and LoRA adapters.

Imports config, prompt, index, replicas, observability; never serving, edge or relay.
"""
