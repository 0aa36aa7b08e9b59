"""Talking to a replica: forwarding, the streamed relay, hop headers, backend keys, usage read on the
way through, phrase chunking and stored responses.

Imports config, replicas, observability, prompt and the top-level modules; never serving.
"""
