"""Refusing private destinations: the download sink's guard against SSRF.

A file URL comes from the upstream's data, so it must not make the receiver fetch from its own
network (a metadata service at 169.254.169.254, an admin port on 127.0.0.1, a database on
10.0.0.5). Three checks, so that the address actually connected is the address checked:

1. :class:`GuardedResolver` wraps aiohttp's resolver and drops every answer the policy refuses.
   The connector connects only to what the resolver returns, so a name cannot resolve to a public
   address for a check and to a private one for the connection (no DNS-rebinding window).
2. IP-literal hosts never reach a resolver, so :func:`check_url` checks them before every request,
   every redirect hop included (redirects are followed by hand, never by aiohttp).
3. Where aiohttp supports a ``socket_factory`` (3.12+), :func:`guarded_socket_factory` checks the
   very ``sockaddr`` handed to ``connect()``, whatever path it came by (defence in depth).

:class:`GuardedClient` puts the three together around its own :class:`aiohttp.ClientSession`.
"""

from __future__ import annotations

import inspect
import ipaddress
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from receiver.errors import PermanentError, TransientError
from receiver.logs import redact_url

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
AddressPolicy = Callable[[IPAddress], bool]
"""Decides whether one address may be connected to (tests inject one that admits loopback)."""

ALLOWED_SCHEMES = frozenset({"http", "https"})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

# Ranges Python's ``ipaddress`` flags inconsistently across versions, refused explicitly.
_SHARED_V4 = ipaddress.IPv4Network("100.64.0.0/10")  # CGNAT
_BENCHMARK_V4 = ipaddress.IPv4Network("198.18.0.0/15")
_V4_COMPAT = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible form
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known NAT64 prefix embeds a v4 address
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # local-use NAT64: site-specific
_TEREDO = ipaddress.IPv6Network("2001::/32")


def is_public_address(ip: IPAddress | str) -> bool:
    """Whether ``ip`` is a globally routable unicast address, safe to fetch from.

    False for loopback, private (RFC 1918, fc00::/7), link-local (169.254/16, fe80::/10),
    unspecified, multicast, reserved, shared (CGNAT 100.64/10) and documentation ranges, and for
    IPv6 forms embedding such an IPv4 address (``::ffff:127.0.0.1``, 6to4, NAT64). A string that
    is not an address is not public.
    """
    if isinstance(ip, str):
        try:
            ip = ipaddress.ip_address(ip)
        except ValueError:
            return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _is_public_v4(ip.ipv4_mapped)
        if ip in _V4_COMPAT or ip in _NAT64_LOCAL or ip in _TEREDO:
            return False
        if ip in _NAT64:
            return _is_public_v4(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None and not _is_public_v4(ip.sixtofour):
            return False
        return not (
            ip.is_loopback
            or ip.is_private
            or ip.is_link_local
            or ip.is_site_local
            or ip.is_multicast
            or ip.is_reserved
            or ip.is_unspecified
            or not ip.is_global
        )
    return _is_public_v4(ip)


def _is_public_v4(ip: ipaddress.IPv4Address) -> bool:
    return not (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
        or ip in _SHARED_V4
        or ip in _BENCHMARK_V4
    )


class AddressRefused(OSError):  # an OSError: aiohttp reports it as a failed connection
    """Every address a host resolves to is refused by the policy."""

    def __init__(self, host: str, message: str | None = None) -> None:
        super().__init__(message or f"refused: {host} resolves to a private address")
        self.host = host


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that drops every answer the policy refuses.

    Raises :class:`AddressRefused` when no answer is left, which aiohttp reports as a failed DNS
    lookup; :class:`GuardedClient` turns it into a :class:`~receiver.errors.PermanentError`.
    """

    def __init__(
        self,
        inner: AbstractResolver | None = None,
        *,
        is_allowed: AddressPolicy = is_public_address,
    ) -> None:
        self._inner = inner if inner is not None else aiohttp.ThreadedResolver()
        self._is_allowed = is_allowed

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The inner resolver's answers, minus those the policy refuses."""
        answers = await self._inner.resolve(host, port, family)
        kept = [a for a in answers if _allowed(a["host"], self._is_allowed)]
        if not kept:
            raise AddressRefused(host)
        return kept

    async def close(self) -> None:
        """Close the inner resolver."""
        await self._inner.close()


def _allowed(address: str, is_allowed: AddressPolicy) -> bool:
    try:
        return is_allowed(ipaddress.ip_address(address))
    except ValueError:
        return False


def guarded_socket_factory(
    is_allowed: AddressPolicy,
) -> Callable[[tuple[Any, Any, Any, Any, Any]], socket.socket]:
    """A ``TCPConnector(socket_factory=...)`` refusing to create a socket for a refused address.

    It sees the exact address about to be connected to, so nothing reaches a private address
    even if a resolver or literal check were bypassed.
    """

    def factory(addr_info: tuple[Any, Any, Any, Any, Any]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        address = str(sockaddr[0])
        if not _allowed(address, is_allowed):
            # One message for every address: aiohappyeyeballs re-raises the error itself (not a
            # generic OSError) only when all its attempts failed with the same text.
            raise AddressRefused(address, "refused: connecting to a private address")
        return socket.socket(family=family, type=type_, proto=proto)

    return factory


_HAS_SOCKET_FACTORY = "socket_factory" in inspect.signature(aiohttp.TCPConnector).parameters


def _looks_like_literal(host: str) -> bool:
    # Mirrors aiohttp's own test: such a host is connected to without any resolver.
    return ":" in host or host.rstrip(".").replace(".", "").isdigit()


def check_url(url: URL, *, allow_private: bool, is_allowed: AddressPolicy) -> None:
    """Refuse a URL before any connection: not http(s), no host, or a refused IP literal.

    Host names are left to :class:`GuardedResolver`, which checks what is actually connected to.
    """
    if url.scheme not in ALLOWED_SCHEMES:
        raise PermanentError(f"refused: only http(s) URLs ({url.scheme or 'no'} scheme)")
    host = url.raw_host
    if not host:
        raise PermanentError("refused: URL has no host")
    if allow_private or not _looks_like_literal(host):
        return
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # Numeric forms like 127.1 or 2130706433 that a socket might still accept.
        raise PermanentError(f"refused: {host} is not a canonical IP address") from None
    if not is_allowed(ip):
        raise PermanentError(f"refused: {host} is a private address")


def _refusal(exc: BaseException) -> AddressRefused | None:
    """The AddressRefused behind an aiohttp connection error, if that is what it is."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, AddressRefused):
            return seen
        os_error = getattr(seen, "os_error", None)
        if isinstance(os_error, AddressRefused):
            return os_error
        seen = seen.__cause__
    return None


class GuardedClient:
    """An HTTP client for untrusted URLs: http(s) only, private destinations refused.

    It owns its session, so the policy and the connector's resolver always agree. Use
    ``await open()`` / ``await close()``, or ``async with``. ``is_allowed`` and ``resolver`` (the
    resolver wrapped by the guard) exist for tests; ``allow_private=True`` turns the guard off
    (the operator's choice for an upstream on a private network) but keeps the scheme check.
    """

    def __init__(
        self,
        *,
        allow_private: bool = False,
        is_allowed: AddressPolicy = is_public_address,
        resolver: AbstractResolver | None = None,
        max_redirects: int = 5,
        user_agent: str = "receiver",
    ) -> None:
        self.allow_private = allow_private
        self.max_redirects = max_redirects
        self._is_allowed = is_allowed
        self._resolver = resolver
        self._headers = {"User-Agent": user_agent}
        self._session: aiohttp.ClientSession | None = None

    def open(self) -> aiohttp.ClientSession:
        """Create the session (needs a running event loop); idempotent."""
        if self._session is None:
            if self.allow_private:
                connector = aiohttp.TCPConnector(resolver=self._resolver)
            else:
                guard = GuardedResolver(self._resolver, is_allowed=self._is_allowed)
                extra: dict[str, Any] = {}
                if _HAS_SOCKET_FACTORY:
                    extra["socket_factory"] = guarded_socket_factory(self._is_allowed)
                connector = aiohttp.TCPConnector(resolver=guard, **extra)
            self._session = aiohttp.ClientSession(
                connector=connector,
                # No cookies travel between the hosts of a redirect chain; no proxy from the
                # environment (it would connect on our behalf, past the resolver).
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                headers=self._headers,
            )
        return self._session

    async def close(self) -> None:
        """Close the session and its connector."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> GuardedClient:
        self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def get(
        self, url: str | URL, *, client_timeout: aiohttp.ClientTimeout | None = None
    ) -> aiohttp.ClientResponse:
        """GET ``url``, following up to ``max_redirects`` redirects, each hop checked.

        Returns the final response unread, for streaming: the caller must release it (``async
        with response:``). Raises :class:`~receiver.errors.PermanentError` for a refused
        destination, a bad URL or too many redirects, and
        :class:`~receiver.errors.TransientError` for connection errors and timeouts.
        """
        session = self.open()
        try:
            current = URL(url) if isinstance(url, str) else url
        except (ValueError, TypeError):
            raise PermanentError("refused: the URL cannot be parsed") from None
        for _hop in range(self.max_redirects + 1):
            check_url(current, allow_private=self.allow_private, is_allowed=self._is_allowed)
            response = await self._request(session, current, client_timeout)
            location = response.headers.get("Location")
            if response.status not in REDIRECT_STATUSES or not location:
                return response
            response.release()
            try:
                current = response.url.join(URL(location)).with_fragment(None)
            except (ValueError, TypeError):
                raise PermanentError("refused: unparseable redirect Location") from None
        raise PermanentError(
            f"too many redirects (more than {self.max_redirects}) from {redact_url(str(url))}"
        )

    async def _request(
        self, session: aiohttp.ClientSession, url: URL, client_timeout: aiohttp.ClientTimeout | None
    ) -> aiohttp.ClientResponse:
        kwargs: dict[str, Any] = {"allow_redirects": False}
        if client_timeout is not None:
            kwargs["timeout"] = client_timeout
        try:
            return await session.get(url, **kwargs)
        except (aiohttp.InvalidURL, ValueError) as exc:
            raise PermanentError(f"refused: invalid URL {redact_url(str(url))}") from exc
        except aiohttp.ClientConnectorError as exc:
            refused = _refusal(exc)
            if refused is not None:
                raise PermanentError(str(refused)) from exc
            raise TransientError(f"cannot connect to {url.host}: {exc.strerror or exc}") from exc
        except TimeoutError as exc:
            raise TransientError(f"timed out requesting {redact_url(str(url))}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise TransientError(f"request to {url.host} failed: {type(exc).__name__}") from exc
