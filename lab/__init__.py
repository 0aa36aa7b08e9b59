"""The lab: the simulator, `bench`, workloads, the load generator, results and plots, and the local
cluster of `up` (replica stubs or real vLLM, peer routers). Kept apart so that serving code never
imports it; the `affinity-gateway` CLI imports it only inside the lab's own commands."""
