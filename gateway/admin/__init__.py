"""The gateway's own routes: the model list, health and readiness, the admin views and the dashboard.

Imports what it shows (routing, replicas, insights, observability, edge, request, config); serving mounts it
and hands it its parts (`OpsParts`): admin never imports serving.
"""
