"""Templates (Jinja2, autoescaped) and the headers every page of the inbox UI is sent with.

Every value reaches HTML through Jinja2's autoescaping: a payload string such as
``<script>alert(1)</script>`` is shown as text. The Content-Security-Policy allows scripts,
styles and images from this origin only and no inline script, so even markup that slipped
through could not run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import jinja2
from aiohttp import web

from receiver.delivery.redelivery import filter_text
from receiver.logs import redact_query_strings
from receiver.store.browse import DeadGroup

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: with no-referrer Chromium sends "Origin: null" on POSTs.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def format_time(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 20 s``, ``5 h 02 min``, ``2 d 4 h``."""
    if seconds is None:
        return "—"
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def relative(ts: float | None, now: float) -> str:
    """``3 min 20 s ago`` or ``in 42 s``."""
    if ts is None:
        return "—"
    delta = now - ts
    if abs(delta) < 1:
        return "now"
    text = format_duration(delta)
    return f"{text} ago" if delta > 0 else f"in {text}"


def pretty_body(body: bytes) -> str:
    """The webhook body, indented when it is JSON (it always is, once accepted), with the query
    strings of its URLs hidden (signed file URLs carry their signature there)."""
    try:
        text = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        text = body.decode("utf-8", errors="replace")
    return redact_query_strings(text)


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON, URL query strings hidden."""
    return redact_query_strings(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def group_key(group: DeadGroup) -> str:
    """A dead-letter group's name in a form: a digest, so the page never carries the error
    text back (errors can hold more than the page shows)."""
    text = json.dumps([group.sink, group.error])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def path_segment(value: str) -> str:
    """``value`` quoted to be one segment of a path (a ``/`` in an id included)."""
    return quote(value, safe="")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("receiver.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        time=format_time,
        duration=format_duration,
        pretty_body=pretty_body,
        pretty_json=pretty_json,
        redact=redact_query_strings,
        group_key=group_key,
        filter_text=filter_text,
        segment=path_segment,
    )
    env.globals["relative"] = relative
    return env


ENVIRONMENT = _environment()


@dataclass(frozen=True)
class View:
    """What every page knows about the request it answers.

    ``csrf`` is the session's CSRF token ("" before signing in); ``signed_in`` whether a
    sign-out button makes sense; ``open_mode`` that no admin token is set (the page says so).
    """

    now: float
    csrf: str = ""
    signed_in: bool = False
    open_mode: bool = False


def render(
    view: View,
    template: str,
    *,
    status: int = 200,
    **context: Any,
) -> web.Response:
    """The page ``template`` with ``context`` and ``view``, as an uncacheable HTML response."""
    section = template.removesuffix(".html")
    values: dict[str, Any] = {"view": view, "now": view.now, "section": section, **context}
    html = ENVIRONMENT.get_template(template).render(values)
    return web.Response(
        status=status,
        text=html,
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


def redirect(location: object) -> web.Response:
    """A 303 to ``location``: after a POST the browser GETs the page that shows the result."""
    return web.Response(status=303, headers={"Location": str(location)})
