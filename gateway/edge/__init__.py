"""What a request must pass before it is routed: the model routes, API keys, body limits and decoding,
and rate limits.

Imports config, observability and the top-level modules; never serving, relay or routing.
"""
