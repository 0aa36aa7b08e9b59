"""The `affinity-gateway` command line: parse arguments and call the app code, nothing else.

May import every gateway package; the lab's commands (`up`, `bench`, `simulate`) are loaded only when
named, so serving never loads the lab.
"""
