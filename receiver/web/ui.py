"""The inbox UI as an aiohttp application, mounted under ``/ui/`` on the ops listener.

Every page goes through one guard (:meth:`InboxUi.guarded`) that decides, in this order:

1. no admin token and the ops listener is not on loopback: the page is off (403, saying why);
2. a token is set and the request has no valid session: GETs go to the sign-in form, POSTs are
   refused (401);
3. no token (loopback): a request naming another host than this machine is refused (no DNS
   rebinding), and a browser without a session gets one, so its forms carry a CSRF token;
4. a POST must carry the session's CSRF token and must not come from another origin (403).

Unknown addresses get a 404 page, a GET on an action's address a 405 page, and a store that
does not answer a 503 page: never a traceback.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from aiohttp import web

from receiver.config.settings import Settings, SinkSettings
from receiver.errors import StoreError
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.store.base import Store
from receiver.upstream.status import UpstreamSide
from receiver.web.auth import (
    SESSION_COOKIE,
    Sessions,
    clear_session_cookie,
    host_is_loopback,
    is_loopback,
    safe_next,
    same_origin,
    set_session_cookie,
)
from receiver.web.incident import IncidentPages
from receiver.web.pages import Pages
from receiver.web.render import SECURITY_HEADERS, View, redirect, render

log = get_logger("receiver.web")

STATIC = Path(__file__).parent / "static"
PageHandler = Callable[[web.Request, View], Awaitable[web.StreamResponse]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InboxUi:
    """The ``/ui/`` application: pages from :class:`~receiver.web.pages.Pages`, behind the guard.

    ``admin_token`` is ``admin.token``; ``admin_host`` is where the ops listener is bound
    (without a token the UI is served only on loopback); ``upstream`` is what this process knows
    of the upstream (its subscription watchdog, its look at the upstream's API), read on every
    overview; ``on_redeliver`` wakes the workers after a redelivery.
    """

    def __init__(
        self,
        *,
        store: Store,
        metrics: Metrics,
        sinks: Sequence[SinkSettings],
        admin_token: str,
        admin_host: str,
        upstream: UpstreamSide | None = None,
        on_redeliver: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        settings: Settings | None = None,
    ) -> None:
        self.sessions = Sessions(token=admin_token)
        self.open_mode = not admin_token
        self.enabled = bool(admin_token) or is_loopback(admin_host)
        self._admin_host = admin_host
        self._clock = clock
        self.incident = IncidentPages(
            store=store,
            settings=settings or Settings(sinks=tuple(sinks)),
            on_change=on_redeliver,
        )
        self.pages = Pages(
            store=store,
            metrics=metrics,
            sinks=sinks,
            upstream=upstream,
            on_redeliver=on_redeliver,
            incident=self.incident,
        )

    def app(self) -> web.Application:
        """The application to mount with ``ops_app.add_subapp("/ui/", ...)``."""
        app = web.Application()
        app.on_response_prepare.append(_security_headers)
        p, i = self.pages, self.incident
        app.add_routes(
            [
                web.get("/", self.guarded(p.overview), name="overview"),
                web.get("/login", self.login_form, name="login"),
                web.post("/login", self.login),
                web.post("/logout", self.guarded(self.logout), name="logout"),
                web.get("/events", self.guarded(p.events), name="events"),
                web.get("/events/{id}", self.guarded(p.event), name="event"),
                web.post("/events/{id}/redeliver", self.guarded(p.redeliver), name="redeliver"),
                web.get("/dead", self.guarded(p.dead), name="dead"),
                web.post("/dead/redeliver", self.guarded(p.redeliver_dead), name="redeliver_dead"),
                web.get("/redeliveries", self.guarded(i.batches), name="redeliveries"),
                web.post("/redeliveries", self.guarded(i.start), name="start_redelivery"),
                web.get("/redeliveries/{id}", self.guarded(i.batch), name="redelivery"),
                web.post("/redeliveries/{id}/cancel", self.guarded(i.cancel), name="cancel"),
                web.post("/lanes/{name}/pause", self.guarded(i.pause), name="pause"),
                web.post("/lanes/{name}/resume", self.guarded(i.resume), name="resume"),
                web.static("/static", STATIC, name="static"),
            ]
        )
        # An action's address opened with GET changes nothing: it says so.
        for path in (
            "/logout",
            "/events/{id}/redeliver",
            "/dead/redeliver",
            "/redeliveries/{id}/cancel",
            "/lanes/{name}/pause",
            "/lanes/{name}/resume",
        ):
            app.router.add_get(path, self.guarded(self.post_only))
        app.router.add_route("*", "/{tail:.*}", self.guarded(self.unknown))
        return app

    # -- the guard ------------------------------------------------------------------------------

    def guarded(self, handler: PageHandler) -> Handler:
        async def guard(request: web.Request) -> web.StreamResponse:
            now = self._clock()
            if not self.enabled:
                return self._disabled(View(now=now))
            if self.open_mode and not host_is_loopback(request):
                return self._foreign_host(View(now=now), request.host)
            session = self.sessions.verify(request.cookies.get(SESSION_COOKIE), now)
            new_cookie = None
            if session is None:
                if self.sessions.needs_login:
                    return self._sign_in_first(request, now)
                new_cookie, session = self.sessions.issue(now)
            view = View(
                now=now,
                csrf=session.csrf,
                signed_in=self.sessions.needs_login,
                open_mode=self.open_mode,
            )
            if request.method == "POST":
                form = await request.post()
                given = form.get("csrf")
                if not same_origin(request) or not self.sessions.csrf_matches(
                    session, given if isinstance(given, str) else None
                ):
                    log.warning("inbox form refused: no valid CSRF token", path=request.path)
                    return render(
                        view,
                        "error.html",
                        status=403,
                        title="Refused",
                        message="This form did not carry this page's CSRF token, so nothing was "
                        "changed. Reload the page and try again.",
                    )
            try:
                response = await handler(request, view)
            except StoreError as exc:
                response = render(
                    view,
                    "error.html",
                    status=503,
                    title="Inbox unavailable",
                    message=f"The inbox store did not answer: {exc.message}",
                )
            if new_cookie is not None:
                set_session_cookie(request, response, new_cookie)
            return response

        return guard

    def _disabled(self, view: View) -> web.Response:
        return render(
            view,
            "error.html",
            status=403,
            title="Inbox page off",
            message=f"admin.token is not set and the ops listener is bound to "
            f"{self._admin_host}, which other machines can reach: the inbox page is served "
            "without a token only on a loopback address. Set admin.token (or "
            "RECEIVER_ADMIN_TOKEN), or bind admin.host to 127.0.0.1.",
        )

    def _foreign_host(self, view: View, host: str) -> web.Response:
        return render(
            view,
            "error.html",
            status=403,
            title="Inbox page off for this address",
            message=f"Without admin.token the inbox page answers only to this machine's own "
            f"names (127.0.0.1, localhost), not to {host!r}. Open it as "
            "http://127.0.0.1:<admin.port>/ui/, or set admin.token.",
        )

    def _sign_in_first(self, request: web.Request, now: float) -> web.StreamResponse:
        if request.method == "GET":
            login = request.app.router["login"].url_for()
            return redirect(login.with_query(next=request.path_qs))
        return render(
            View(now=now),
            "error.html",
            status=401,
            title="Sign in first",
            message="Your session has ended (or the receiver restarted): sign in again.",
        )

    # -- signing in and out ---------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        view = View(now=self._clock(), open_mode=self.open_mode)
        if not self.enabled:
            return self._disabled(view)
        if not self.sessions.needs_login:
            return redirect(request.app.router["overview"].url_for())
        return render(view, "login.html", title="Sign in", next=request.query.get("next", ""))

    async def login(self, request: web.Request) -> web.StreamResponse:
        now = self._clock()
        view = View(now=now, open_mode=self.open_mode)
        if not self.enabled:
            return self._disabled(view)
        if not self.sessions.needs_login:
            return redirect(request.app.router["overview"].url_for())
        form = await request.post()
        token, target = form.get("token"), form.get("next")
        next_page = target if isinstance(target, str) else ""
        if not same_origin(request) or not isinstance(token, str):
            return render(
                view,
                "login.html",
                status=400,
                title="Sign in",
                next=next_page,
                error="The sign-in form was not sent from this page.",
            )
        if not self.sessions.token_matches(token):
            log.warning("inbox sign-in refused: wrong admin token", peer=request.remote)
            return render(
                view,
                "login.html",
                status=401,
                title="Sign in",
                next=next_page,
                error="That is not the admin token: nothing was signed in.",
            )
        cookie, _session = self.sessions.issue(now)
        response = redirect(safe_next(next_page))
        set_session_cookie(request, response, cookie)
        log.info("inbox sign-in", peer=request.remote)
        return response

    async def logout(self, request: web.Request, _view: View) -> web.StreamResponse:
        response = redirect(request.app.router["login"].url_for())
        clear_session_cookie(response)
        return response

    async def post_only(self, _request: web.Request, view: View) -> web.Response:
        response = render(
            view,
            "error.html",
            status=405,
            title="Use the page's buttons",
            message="This address only takes the form the page's buttons send (a POST): "
            "opening it changes nothing.",
        )
        response.headers["Allow"] = "POST"
        return response

    async def unknown(self, _request: web.Request, view: View) -> web.Response:
        return render(
            view, "error.html", status=404, title="Not found", message="No page at this address."
        )


async def _security_headers(_request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
