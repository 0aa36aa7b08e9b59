"""Talking to a replica: forwarding, the streamed relay, hop headers, backend keys, usage read on the
way through, phrase chunking and stored responses.

Imports config, replicas, request, routing (the route table, for stored responses' by-id routes), support
and the top-level modules; never serving.
"""
