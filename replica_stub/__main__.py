"""`python -m replica_stub ...` is the same as the `replica-stub` console script."""

from replica_stub.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
