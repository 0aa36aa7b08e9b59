"""What a request must pass before it is routed: the model routes, API keys, body limits and decoding,
and rate limits.

Imports config, prompt, request and the top-level modules; never serving, admin, relay or routing.
"""
