"""Named fields of an enriched event, and the small templates that use them.

Chat messages (``template``), AMQP routing keys and NATS subjects may name fields of the event in
braces: ``"{event} for {item_name}"``. Only plain names are allowed (no attribute access, index,
conversion or format spec), so a template can never reach into Python objects; ``{{`` and ``}}``
are literal braces. A field without a value renders as the empty string.

This module is pure and imports nothing heavy: config validation uses it.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from receiver.events import Enriched

#: Fields a chat ``template`` may use; ``url_<asset type>`` (e.g. ``{url_image}``) as well.
MESSAGE_FIELDS = (
    "event",
    "event_id",
    "job_id",
    "job_type",
    "status",
    "item_name",
    "item_id",
    "collection_id",
    "error",
    "asset_count",
    "asset_urls",
)
URL_FIELD_PREFIX = "url_"
#: Fields a routing key or subject may use: short values without spaces.
ROUTING_FIELDS = ("event", "job_type")
UNKNOWN_JOB_TYPE = "unknown"

_FORMATTER = string.Formatter()


def field_names(template: str) -> list[str]:
    """The field names a template uses, in order; ValueError when its braces are unbalanced."""
    return [name for _, name, _, _ in _FORMATTER.parse(template) if name is not None]


def template_problems(
    template: str, allowed: Collection[str], *, url_fields: bool = False
) -> list[str]:
    """What is wrong with ``template`` (empty when it is fine)."""
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        return [f"is not a valid template ({exc}; write {{{{ and }}}} for literal braces)"]
    problems = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if spec or conversion:
            problems.append(f"{{{name}...}}: conversions and format specs are not supported")
        elif name not in allowed and not (
            url_fields and name.startswith(URL_FIELD_PREFIX) and name[4:].isidentifier()
        ):
            known = ", ".join(f"{{{f}}}" for f in allowed)
            extra = ", {url_<asset type>}" if url_fields else ""
            problems.append(f"{{{name}}} is not a known field (known: {known}{extra})")
    return problems


def render(
    template: str, values: Mapping[str, str], escape: Callable[[str], str] | None = None
) -> str:
    """``template`` with every field replaced by its (escaped) value; a missing field is empty."""
    out: list[str] = []
    for literal, name, _spec, _conversion in _FORMATTER.parse(template):
        out.append(literal)
        if name is not None:
            value = values.get(name, "")
            out.append(escape(value) if escape else value)
    return "".join(out)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def asset_urls(enriched: Enriched) -> dict[str, str]:
    """Asset type -> URL: each fresh asset's ``cdn_url`` or signed ``file_url``, else the
    fresh job's ``urls``."""
    urls: dict[str, str] = {}
    for asset in enriched.assets:
        url = asset.get("cdn_url") or asset.get("file_url")
        if url:
            urls.setdefault(_text(asset.get("type") or asset.get("id")), str(url))
    if not urls:
        job_urls = enriched.job.get("urls")
        if isinstance(job_urls, Mapping):
            urls = {str(k): str(v) for k, v in job_urls.items() if isinstance(v, str) and v}
    return urls


def event_fields(enriched: Enriched) -> dict[str, str]:
    """Every named field of an enriched event, as text."""
    job = enriched.job
    urls = asset_urls(enriched) if enriched.event_name == "job.completed" else {}
    fields = {
        "event": enriched.event_name,
        "event_id": enriched.event_id,
        "job_id": enriched.job_id,
        "job_type": enriched.job_type or "",
        "status": _text(job.get("status")),
        "item_name": _text(job.get("item_name")),
        "item_id": _text(job.get("item_id")),
        "collection_id": _text(job.get("collection_id")),
        "error": _text(job.get("error")),
        "asset_count": str(len(urls)),
        "asset_urls": "\n".join(f"{kind}: {url}" for kind, url in urls.items()),
    }
    fields.update({f"{URL_FIELD_PREFIX}{kind}": url for kind, url in urls.items()})
    return fields


def routing_fields(enriched: Enriched) -> dict[str, str]:
    """The fields a routing key or subject may use."""
    return {"event": enriched.event_name, "job_type": enriched.job_type or UNKNOWN_JOB_TYPE}
