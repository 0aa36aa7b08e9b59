"""The replicas' vLLM KV events: decoding batches, one subscriber per replica, and the running feeds.

Imports the index, replicas, prompt and config; never routing or serving.
"""
