"""`python -m gateway ...` is the same as the `affinity-gateway` console script."""

from gateway.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
