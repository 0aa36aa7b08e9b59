"""The running app: the aiohttp app and its request handler, the attempt loop, admission, startup and
graceful shutdown, and `serve --workers`.

The top of the serving graph: it may import every other package but `gateway.cli`; none imports it.
"""
