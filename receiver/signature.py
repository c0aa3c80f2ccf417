"""Webhook signatures: pure functions with the clock passed in.

The upstream signs ``"<t>." + raw body`` with HMAC-SHA256 and sends
``Service-Signature: t=<unix seconds>,v1=<hex>``. A header may carry several ``v1`` values (the
sender rotating its secret); unknown schemes are ignored. The legacy ``X-Service-Signature:
sha256=<hex>`` covers the body only, so it cannot resist replay: it is accepted only when the
operator opts in.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

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


def verify(
    *,
    secrets: Sequence[str],
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
    if header is None:
        if allow_legacy and legacy_header is not None:
            return _verify_legacy(secrets, body, legacy_header)
        raise SignatureError("missing_signature", f"no {SIGNATURE_HEADER} header")
    timestamp, signatures = parse_header(header)
    signed = str(timestamp).encode() + b"." + body
    matched: int | None = None
    for index, secret in enumerate(secrets):
        # hmac.digest: OpenSSL's one-shot HMAC, without building an HMAC object per request.
        expected = hmac.digest(secret.encode(), signed, "sha256").hex()
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
    return Verified(secret_index=matched, timestamp=timestamp, skew_seconds=skew, scheme="v1")


def _verify_legacy(secrets: Sequence[str], body: bytes, header: str) -> Verified:
    scheme, sep, value = header.strip().partition("=")
    if not sep or scheme != "sha256" or len(value) != 64 or not _HEX.issuperset(value):
        raise SignatureError("invalid_signature", f"{LEGACY_SIGNATURE_HEADER} is malformed")
    value = value.lower()
    matched: int | None = None
    for index, secret in enumerate(secrets):
        expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected, value) and matched is None:
            matched = index
    if matched is None:
        raise SignatureError("invalid_signature", "legacy signature matches no configured secret")
    return Verified(secret_index=matched, timestamp=None, skew_seconds=None, scheme="legacy")
