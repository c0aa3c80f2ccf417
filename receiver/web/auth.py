"""Who may use the inbox page: signed session cookies, CSRF tokens, and the loopback rule.

With ``admin.token`` set, a person signs in once with the token (``POST /ui/login``, field
``token``) and gets a session cookie: HttpOnly, ``SameSite=Strict``, ``Secure`` over HTTPS, for
:data:`SESSION_SECONDS`. The cookie is ``{session id}.{expiry}.{HMAC}``, signed with a key drawn
at random when the process starts: nothing is stored on the server, and every session ends when
the receiver restarts. Without a token the page is served only while the ops listener is bound
to a loopback address, and only to requests that name this machine (``Host: 127.0.0.1`` or
``localhost``: no DNS rebinding); each browser still gets a session, so that forms carry a CSRF
token too.

Every state-changing request is a POST whose form carries ``csrf``, an HMAC of the session id:
a page of another site cannot read it, so it cannot forge the form. A POST whose ``Origin``
names another site is refused as well.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from aiohttp import web

SESSION_COOKIE = "receiver_ui_session"
SESSION_SECONDS = 12 * 3600
COOKIE_PATH = "/ui/"


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def host_is_loopback(request: web.Request) -> bool:
    """Whether the request names this machine in its Host header. Without a token, a page that
    answered any name could be read by another site whose name was made to point at 127.0.0.1
    (DNS rebinding); answering only loopback names closes that."""
    host = request.host
    bracketed = host.startswith("[")  # [::1]:9091
    return is_loopback(host[1:].split("]", 1)[0] if bracketed else host.rsplit(":", 1)[0])


@dataclass(frozen=True)
class Session:
    """A verified session: its id, and the CSRF token its forms must carry."""

    id: str
    csrf: str


class Sessions:
    """Issues and checks session cookies and CSRF tokens (see the module docstring).

    ``token`` is the admin token ("" for none); ``key`` the signing key (random by default).
    """

    def __init__(self, *, token: str, key: bytes | None = None) -> None:
        self._token_digest = hashlib.sha256(token.encode()).digest() if token else b""
        self._key = key or secrets.token_bytes(32)

    @property
    def needs_login(self) -> bool:
        return bool(self._token_digest)

    def token_matches(self, given: str) -> bool:
        """Constant-time comparison (of digests, so the length of the token does not leak)."""
        if not self._token_digest:
            return False
        digest = hashlib.sha256(given.encode()).digest()
        return hmac.compare_digest(digest, self._token_digest)

    def _mac(self, purpose: str, text: str) -> str:
        return hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).hexdigest()

    def issue(self, now: float) -> tuple[str, Session]:
        """A new session: the cookie value to set, and the session it stands for."""
        session_id = secrets.token_urlsafe(18)
        signed = f"{session_id}.{int(now + SESSION_SECONDS)}"
        return f"{signed}.{self._mac('session', signed)}", self._session(session_id)

    def verify(self, cookie: str | None, now: float) -> Session | None:
        """The session a cookie stands for, or None when it is forged, altered or expired."""
        if not cookie or cookie.count(".") != 2:
            return None
        session_id, expires, mac = cookie.split(".")
        signed = f"{session_id}.{expires}"
        if not hmac.compare_digest(mac, self._mac("session", signed)):
            return None
        if not expires.isdigit() or int(expires) < now:
            return None
        return self._session(session_id)

    def _session(self, session_id: str) -> Session:
        return Session(session_id, self._mac("csrf", session_id))

    @staticmethod
    def csrf_matches(session: Session, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, session.csrf)


def set_session_cookie(request: web.Request, response: web.StreamResponse, value: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=SESSION_SECONDS,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=is_https(request),
    )


def clear_session_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(SESSION_COOKIE, path=COOKIE_PATH)


def is_https(request: web.Request) -> bool:
    """HTTPS directly, or as a TLS proxy in front of the ops listener says."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or forwarded == "https"


def same_origin(request: web.Request) -> bool:
    """False when the request names another site as its ``Origin`` (absent is allowed)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    host = request.headers.get("X-Forwarded-Host") or request.host
    return origin in (f"http://{host}", f"https://{host}")


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a page of this UI only, never another site."""
    if not target or not target.startswith(COOKIE_PATH):
        return COOKIE_PATH
    if any(c in target for c in "\\\r\n"):
        return COOKIE_PATH
    return target
