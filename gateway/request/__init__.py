"""One proxied request's records: who sent it (`caller`), what routing decided (`decision`), its usage and
timing, the `Exchange` filled in while it runs and the `FinishedRequest` observers read once it ended
(`exchange`), and the observers' registry (`observers`).

Data and hooks only: imports config and the top-level modules, so that every feature may import it.
"""
