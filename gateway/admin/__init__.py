"""The gateway's own routes: the model list, health and readiness, the admin views and the dashboard.

Imports what it shows (routing, replicas, insights, observability); serving mounts it.
"""
