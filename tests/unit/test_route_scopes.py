"""Every route of the app is in ``api/auth.py``'s scope table (or explicitly open), and every
route that needs a scope actually runs the ``Auth`` dependency. A branch that adds a route
without declaring it fails here (the route would need ``admin`` until then: fail closed)."""

from __future__ import annotations

from fastapi.routing import APIRoute
from starlette.routing import Mount

from conveyor.api.app import create_app
from conveyor.api.auth import OPEN, OPEN_MOUNTS, ROUTE_SCOPES, Auth, declared_scope, template
from conveyor.core.apikeys import SCOPES
from conveyor.core.config import Settings


def _app_routes() -> list[object]:
    return list(create_app(Settings(auth="required")).routes)


def test_every_route_declares_a_scope_or_open() -> None:
    missing, unguarded, seen = [], [], set()
    for route in _app_routes():
        path: str = getattr(route, "path", "")
        if isinstance(route, Mount):
            assert path in OPEN_MOUNTS, f"mount {path} is not declared open"
            continue
        for method in sorted(getattr(route, "methods", None) or ()):
            scope = declared_scope(method, path)
            seen.add(("GET" if method == "HEAD" else method, template(path)))
            if scope is None:
                missing.append(f"{method} {path}")
            elif scope != OPEN:
                # only an APIRoute runs the app's dependencies; anything else is unguarded
                deps = route.dependant.dependencies if isinstance(route, APIRoute) else []
                if not any(isinstance(d.call, Auth) for d in deps):
                    unguarded.append(f"{method} {path}")
    assert not missing, f"routes without a scope in api/auth.py ROUTE_SCOPES: {missing}"
    assert not unguarded, f"routes that need a scope but do not run Auth: {unguarded}"
    stale = set(ROUTE_SCOPES) - seen
    assert not stale, f"ROUTE_SCOPES names routes the app does not have: {sorted(stale)}"


def test_the_table_uses_only_known_scopes() -> None:
    assert set(ROUTE_SCOPES.values()) <= {OPEN, *SCOPES}
    # the probes stay open; every job operation needs a key
    assert ROUTE_SCOPES[("GET", "/healthz")] == ROUTE_SCOPES[("GET", "/readyz")] == OPEN
    assert all(s != OPEN for (m, p), s in ROUTE_SCOPES.items() if p.startswith("/jobs"))


def test_an_undeclared_route_needs_admin() -> None:
    app = create_app(Settings(auth="required"))

    @app.get("/not-declared")
    async def _x() -> dict[str, str]:
        return {}

    auth: Auth = app.state.auth
    route = next(r for r in app.routes if getattr(r, "path", "") == "/not-declared")
    assert isinstance(route, APIRoute)
    assert any(isinstance(d.call, Auth) for d in route.dependant.dependencies)

    class _Req:
        method = "GET"
        scope = {"route": route}

    assert auth._route(_Req())[0] == "admin"  # type: ignore[arg-type]
