"""The replicas' vLLM KV events: decoding batches, and one subscriber per replica feeding a sink (the
running feeds, one per replica of each pool, are the route table's: `gateway.routing.kv_feeds`).

Imports config and support only; never routing or serving.
"""
