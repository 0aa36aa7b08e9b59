"""`GET /dashboard`: one live page over the admin routes, served from the package (no build step, no CDN).

The page and its two assets are read once when the app is made and answered from memory. They hold no
data: the page's script polls `/admin/replicas`, `/admin/decisions`, `/admin/usage`,
`/admin/prefix-report` and `/admin/sessions` once a second, with the admin key when auth is on (taken
from the URL's `#key=` fragment, which never reaches a server, or asked for once and kept in the tab's
sessionStorage), so the page itself is open like /health.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

_ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
DASHBOARD_PATHS = frozenset({"/dashboard", *(f"/dashboard/{name}" for name in _ASSETS)})


def add_dashboard_routes(app: web.Application) -> None:
    static = resources.files("gateway.admin") / "static"
    page = (static / "dashboard.html").read_bytes()
    assets = {name: (static / name).read_bytes() for name in _ASSETS}

    async def dashboard(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers={"Cache-Control": "no-cache"})

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in assets:
            raise web.HTTPNotFound()
        return web.Response(
            body=assets[name], content_type=_ASSETS[name], charset="utf-8", headers={"Cache-Control": "no-cache"}
        )

    app.router.add_get("/dashboard", dashboard)
    app.router.add_get("/dashboard/{name}", asset)
