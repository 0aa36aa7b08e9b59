"""What the traffic tells: token costs and cache savings, agent-session timelines, the prefix hygiene
report.

Imports config, prompt, request, support and the top-level modules; never serving.
"""
