"""Every route of the app is in ``api/auth.py``'s scope table (or explicitly open), and every
route that needs a scope actually runs ``Auth`` (is of the guarded route class ``auth.install``
puts on the app's router). A branch that adds a route
without declaring it fails here (the route would need ``admin`` until then: fail closed)."""

from __future__ import annotations

from fastapi.routing import APIRoute
from starlette.routing import Mount, Route

from conveyor.api.app import create_app
from conveyor.api.auth import OPEN, OPEN_MOUNTS, ROUTE_SCOPES, Auth, declared_scope, template
from conveyor.core.apikeys import SCOPES
from conveyor.core.config import Settings


def test_every_route_declares_a_scope_or_open() -> None:
    app = create_app(Settings(auth="required"))
    guarded = app.state.auth.route_class
    assert guarded is not None and issubclass(guarded, APIRoute)
    missing, unguarded, seen = [], [], set()
    for route in app.routes:
        path: str = getattr(route, "path", "")
        # anything else (an included router, a host, a websocket) has no path or methods here,
        # so the checks below would not see it
        assert isinstance(route, APIRoute | Route | Mount), f"unexpected {type(route).__name__}"
        if isinstance(route, Mount):
            assert path in OPEN_MOUNTS, f"mount {path} is not declared open"
            continue
        for method in sorted(getattr(route, "methods", None) or ()):
            scope = declared_scope(method, path)
            seen.add(("GET" if method == "HEAD" else method, template(path)))
            if scope is None:
                missing.append(f"{method} {path}")
            elif scope != OPEN and not isinstance(route, guarded):
                # only the guarded route class runs Auth; anything else is unguarded
                unguarded.append(f"{method} {path}")
            if isinstance(route, APIRoute):  # the guarded class runs Auth itself, not twice
                assert not route.dependant.dependencies, f"{method} {path} solves a dependency"
    # a route of any other class (a router included later) runs the fail-closed dependency
    assert any(d.dependency == app.state.auth.foreign for d in app.router.dependencies)
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
    assert isinstance(route, APIRoute) and auth.route_class is not None
    assert isinstance(route, auth.route_class)

    class _Req:
        method = "GET"
        scope = {"route": route}

    assert auth._route(_Req())[0] == "admin"  # type: ignore[arg-type]


def test_a_router_included_later_is_not_missed() -> None:
    """An ``APIRouter`` included with ``include_router`` shows in ``app.routes`` as one object
    with no path and no methods: the walk above must not skip it silently."""
    from fastapi import APIRouter

    app = create_app(Settings(auth="required"))
    router = APIRouter()

    @router.get("/sneaky")
    async def sneaky() -> None:
        return None

    app.include_router(router)
    odd = [r for r in app.routes if not isinstance(r, APIRoute | Route | Mount)]
    assert odd, "FastAPI lists included routers as themselves: the walk must refuse them"
