"""The hop benchmark: what one proxied request costs a router, driven by wrk (`python -m bench.hop`)."""
