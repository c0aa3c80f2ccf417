"""Webhook signatures: pure functions with the clock passed in.

The upstream signs ``"<t>." + raw body`` with HMAC-SHA256 and sends
``Service-Signature: t=<unix seconds>,v1=<hex>``. A header may carry several ``v1`` values (the
sender rotating its secret); unknown schemes are ignored. The legacy ``X-Service-Signature:
sha256=<hex>`` covers the body only, so it cannot resist replay: it is accepted only when the
operator opts in.

What the receiver itself sends (its http sink, ``receiver sign``/``replay``) may instead be signed
the Standard Webhooks way (:class:`Signer`), which consumers verify with any Standard Webhooks
library.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from secrets import token_bytes

from receiver.errors import SignatureError

SIGNATURE_HEADER = "Service-Signature"
LEGACY_SIGNATURE_HEADER = "X-Service-Signature"
_HEX = frozenset("0123456789abcdefABCDEF")
_MAX_HEADER_LENGTH = 4096


@dataclass(frozen=True)
class Verified:
    """A signature that matched: which secret (by position) and how far the clocks differ."""

    secret_index: int
    timestamp: int | None
    skew_seconds: float | None
    scheme: str


def compute(secret: str, timestamp: int, body: bytes) -> str:
    """Hex HMAC-SHA256 of ``"<timestamp>." + body``."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return mac.hexdigest()


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The ``Service-Signature`` value for ``body`` at ``timestamp``."""
    return f"t={timestamp},v1={compute(secret, timestamp, body)}"


def webhook_headers(
    secret: str, body: bytes, timestamp: int, *, event_id: str | None, event_name: str | None
) -> dict[str, str]:
    """Every header the upstream sends with a webhook, for these exact body bytes."""
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(secret, body, timestamp),
        "X-Service-Timestamp": str(timestamp),
        LEGACY_SIGNATURE_HEADER: "sha256="
        + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }
    if event_id:
        headers["Service-Event-Id"] = event_id
    if event_name:
        headers["X-Service-Event"] = event_name
    return headers


def parse_header(header: str) -> tuple[int, list[str]]:
    """Split a ``Service-Signature`` value into its timestamp and ``v1`` signatures.

    Raises SignatureError(invalid_signature) for anything malformed.
    """
    if len(header) > _MAX_HEADER_LENGTH:
        raise SignatureError("invalid_signature", "signature header is too long")
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key or not value:
            raise SignatureError("invalid_signature", "signature header is malformed")
        if key == "t":
            if timestamp is not None:
                raise SignatureError("invalid_signature", "signature header has two timestamps")
            if not value.isascii() or not value.isdigit() or len(value) > 12:
                raise SignatureError("invalid_signature", "signature timestamp is not a number")
            timestamp = int(value)
        elif key == "v1":
            if len(value) != 64 or not _HEX.issuperset(value):
                raise SignatureError("invalid_signature", "v1 signature is not 64 hex digits")
            signatures.append(value.lower())
    if timestamp is None:
        raise SignatureError("invalid_signature", "signature header has no timestamp")
    if not signatures:
        raise SignatureError("invalid_signature", "signature header has no v1 signature")
    return timestamp, signatures


# What the upstream sends: one timestamp, then one signature. Such a header is split by one
# match; any other goes through parse_header, which accepts exactly the same for this shape.
_USUAL_HEADER = re.compile(r"t=([0-9]{1,12}),v1=([0-9a-fA-F]{64})")


def _digests(header: str) -> tuple[int, list[bytes]]:
    """:func:`parse_header` with the signatures as the 32 bytes they spell."""
    usual = _USUAL_HEADER.fullmatch(header)
    if usual is not None:
        return int(usual[1]), [bytes.fromhex(usual[2])]
    timestamp, signatures = parse_header(header)
    return timestamp, [bytes.fromhex(s) for s in signatures]


def check(
    keys: Sequence[str | bytes | HmacKey],
    body: bytes,
    header: str | None,
    now: float,
    tolerance_seconds: float,
    legacy_header: str | None = None,
    allow_legacy: bool = False,
) -> tuple[int, int | None]:
    """:func:`verify` without building its result: the position of the matching secret and
    the signature's timestamp (None for a legacy signature). Intake calls this for every
    webhook, with the secrets prepared once (``keys``: see :class:`HmacKey`)."""
    if header is None:
        if allow_legacy and legacy_header is not None:
            return _verify_legacy(keys, body, legacy_header), None
        raise SignatureError("missing_signature", f"no {SIGNATURE_HEADER} header")
    timestamp, signatures = _digests(header)
    signed = b"%d.%b" % (timestamp, body)
    matched: int | None = None
    for index, key in enumerate(keys):
        expected = _key(key).digest(signed)
        for candidate in signatures:
            if hmac.compare_digest(expected, candidate) and matched is None:
                matched = index
    if matched is None:
        raise SignatureError("invalid_signature", "no v1 signature matches a configured secret")
    skew = now - timestamp
    if abs(skew) > tolerance_seconds:
        raise SignatureError(
            "stale_timestamp",
            f"signature timestamp is {skew:+.0f} s from the receiver's clock "
            f"(tolerance {tolerance_seconds:.0f} s)",
            skew_seconds=skew,
        )
    return matched, timestamp


def verify(
    *,
    secrets: Sequence[str | bytes | HmacKey],
    body: bytes,
    header: str | None,
    now: float,
    tolerance_seconds: float,
    legacy_header: str | None = None,
    allow_legacy: bool = False,
) -> Verified:
    """Check a webhook's signature over its exact raw bytes.

    Every comparison is constant-time. Raises :class:`SignatureError` whose ``outcome`` is
    ``missing_signature``, ``invalid_signature`` or ``stale_timestamp``.
    """
    index, timestamp = check(
        secrets, body, header, now, tolerance_seconds, legacy_header, allow_legacy
    )
    if timestamp is None:
        return Verified(secret_index=index, timestamp=None, skew_seconds=None, scheme="legacy")
    return Verified(
        secret_index=index, timestamp=timestamp, skew_seconds=now - timestamp, scheme="v1"
    )


class HmacKey:
    """An HMAC-SHA256 key with its two padded blocks hashed once (RFC 2104).

    ``digest(message)`` equals ``hmac.digest(secret, message, "sha256")``: a copy of each
    prepared hash takes the message and the inner digest, which saves hashing the padded key
    twice and OpenSSL looking the algorithm up by name on every call (half the time of an
    800-byte webhook's HMAC).
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, secret: str | bytes) -> None:
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(key.translate(_IPAD))
        self._outer = hashlib.sha256(key.translate(_OPAD))

    def digest(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


_BLOCK = 64  # SHA-256's block size
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


def _key(secret: str | bytes | HmacKey) -> HmacKey:
    return secret if isinstance(secret, HmacKey) else HmacKey(secret)


def _verify_legacy(keys: Sequence[str | bytes | HmacKey], body: bytes, header: str) -> int:
    scheme, sep, value = header.strip().partition("=")
    if not sep or scheme != "sha256" or len(value) != 64 or not _HEX.issuperset(value):
        raise SignatureError("invalid_signature", f"{LEGACY_SIGNATURE_HEADER} is malformed")
    signature = bytes.fromhex(value)
    matched: int | None = None
    for index, key in enumerate(keys):
        expected = _key(key).digest(body)
        if hmac.compare_digest(expected, signature) and matched is None:
            matched = index
    if matched is None:
        raise SignatureError("invalid_signature", "legacy signature matches no configured secret")
    return matched


# --- Standard Webhooks (https://www.standardwebhooks.com), for what the receiver sends ---------
#
# The sender signs ``"<webhook-id>.<webhook-timestamp>." + body`` with HMAC-SHA256 keyed with
# the base64-decoded part of a ``whsec_<base64>`` secret, and sends ``webhook-id``,
# ``webhook-timestamp`` and ``webhook-signature: v1,<base64 signature>``.

SERVICE_SCHEME = "service"
STANDARD_WEBHOOKS_SCHEME = "standard-webhooks"
#: The signing schemes the http sink, ``receiver sign`` and ``receiver replay`` offer.
SCHEMES = (SERVICE_SCHEME, STANDARD_WEBHOOKS_SCHEME)
WHSEC_PREFIX = "whsec_"
_BASE64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def standard_webhooks_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret; ValueError saying what is wrong otherwise.

    Strict where the libraries are lenient (they skip characters outside the base64 alphabet,
    so a URL-safe secret would sign with another key than the consumer's): standard base64 only,
    padding optional.
    """
    hint = f"must be {WHSEC_PREFIX}<base64> for Standard Webhooks"
    if not secret.startswith(WHSEC_PREFIX):
        raise ValueError(f"{hint} (it does not start with {WHSEC_PREFIX})")
    encoded = secret[len(WHSEC_PREFIX) :].rstrip("=")
    if not encoded:
        raise ValueError(f"{hint} (nothing follows {WHSEC_PREFIX})")
    if not _BASE64.issuperset(encoded) or len(encoded) % 4 == 1:
        raise ValueError(f"{hint} (what follows {WHSEC_PREFIX} is not standard base64)")
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))


def new_standard_webhooks_secret() -> str:
    """A fresh ``whsec_`` secret: base64 of 32 random bytes."""
    return WHSEC_PREFIX + base64.b64encode(token_bytes(32)).decode()


def standard_webhooks_headers(
    key: bytes, body: bytes, timestamp: int, *, msg_id: str
) -> dict[str, str]:
    """The Standard Webhooks headers for these exact body bytes (``key``: see
    :func:`standard_webhooks_key`)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.digest(key, signed, "sha256")).decode()
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,{signature}",
    }


class Signer:
    """Signs outgoing bodies in one scheme with one secret, checked once here.

    ``service``: :func:`webhook_headers`. ``standard-webhooks``: :func:`standard_webhooks_headers`
    with the event id as ``webhook-id`` (a fresh ``msg_`` id when there is none). Raises
    ValueError for an unknown scheme or a secret the scheme cannot use.
    """

    def __init__(self, scheme: str, secret: str) -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown signing scheme {scheme!r} (one of {', '.join(SCHEMES)})")
        self.scheme = scheme
        self._secret = secret
        self._key = standard_webhooks_key(secret) if scheme == STANDARD_WEBHOOKS_SCHEME else b""

    def headers(
        self, body: bytes, timestamp: int, *, event_id: str | None, event_name: str | None
    ) -> dict[str, str]:
        """The signature headers (and ``Content-Type: application/json``) for ``body``."""
        if self.scheme == SERVICE_SCHEME:
            return webhook_headers(
                self._secret, body, timestamp, event_id=event_id, event_name=event_name
            )
        msg_id = event_id or f"msg_{uuid.uuid4().hex}"
        return standard_webhooks_headers(self._key, body, timestamp, msg_id=msg_id)
