"""The ``slack`` sink: a short message about each event, POSTed to a chat incoming webhook.

``format`` picks the body: ``slack`` (``{"text", "blocks"}``), ``discord`` (``{"content",
"embeds"}``, mentions disabled), ``teams`` (an Office 365 message card) or ``generic`` (the text
plus the event's fields as JSON). The text is ``template`` with the event's named fields (see
:mod:`receiver.outbound.template`), or by default one line naming the event, the job type and id,
the item and, for failures, the job's error. Values from the event are escaped for Slack's
markup, so an item name cannot mention ``@channel`` or forge a link.

Messages are paced by the sink's lane at ``rate_limit_per_second`` (default 1, Slack's
documented rate for incoming webhooks; see :mod:`receiver.delivery.lanes`): ``send`` never waits for
a slot. A 429's ``Retry-After`` is raised with the error, and the lane pauses for that long, on
every replica. A 4xx other than 408/429 (hook removed, channel archived, payload refused) is dead
at once; 5xx and network errors are retried.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from receiver.config.settings import SinkSettings
from receiver.events import Enriched
from receiver.outbound.envelopes import trace_headers
from receiver.outbound.template import asset_urls, event_fields, render
from receiver.sinks.base import SinkContext
from receiver.sinks.posting import origin, post

COLOUR_OK = 0x2EB67D
COLOUR_FAILED = 0xE01E5A
SLACK_TEXT_LIMIT = 3000
DISCORD_CONTENT_LIMIT = 2000
ERROR_LIMIT = 500
_RETRYABLE_4XX = frozenset({408, 425, 429})


def slack_escape(text: str) -> str:
    """Escape the three characters Slack's markup gives meaning to."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failed(fields: Mapping[str, str]) -> bool:
    return fields["event"] == "job.failed" or fields["status"] == "failed"


def default_text(fields: Mapping[str, str], escape: Callable[[str], str] = str) -> str:
    """One line naming the event, job, item and, for a failure, the job's error."""
    icon = "❌" if failed(fields) else "✅"
    job_type = fields["job_type"] or "job"
    text = f"{icon} {escape(fields['event'])}: {escape(job_type)} job {escape(fields['job_id'])}"
    if fields["item_name"]:
        text += f" for “{escape(fields['item_name'])}”"
    if failed(fields):
        error = _clip(fields["error"], ERROR_LIMIT) or "no error given"
        text += f" failed: {escape(error)}"
    elif fields["asset_count"] != "0":
        count = fields["asset_count"]
        text += f" ({count} asset{'' if count == '1' else 's'})"
    return text


def _facts(fields: Mapping[str, str]) -> list[tuple[str, str]]:
    facts = [("Job", fields["job_id"]), ("Type", fields["job_type"] or "-")]
    if fields["item_name"]:
        facts.append(("Item", fields["item_name"]))
    if failed(fields):
        facts.append(("Error", _clip(fields["error"], ERROR_LIMIT) or "-"))
    return facts


def build_message(fmt: str, enriched: Enriched, template: str | None = None) -> dict[str, Any]:
    """The JSON body for ``fmt`` (slack, discord, teams or generic)."""
    fields = event_fields(enriched)
    escape = slack_escape if fmt == "slack" else str
    text = render(template, fields, escape) if template else default_text(fields, escape)
    title = f"{fields['event']}: {fields['job_type'] or 'job'}"
    if fmt == "slack":
        text = _clip(text, SLACK_TEXT_LIMIT)
        return {
            "text": text,
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": text}},
                {
                    "type": "context",
                    "elements": [
                        {"type": "mrkdwn", "text": f"event {slack_escape(fields['event_id'])}"}
                    ],
                },
            ],
        }
    if fmt == "discord":
        return {
            "content": _clip(text, DISCORD_CONTENT_LIMIT),
            "embeds": [
                {
                    "title": title,
                    "color": COLOUR_FAILED if failed(fields) else COLOUR_OK,
                    "fields": [
                        {"name": name, "value": value, "inline": name != "Error"}
                        for name, value in _facts(fields)
                    ],
                    "footer": {"text": f"event {fields['event_id']}"},
                }
            ],
            "allowed_mentions": {"parse": []},
        }
    if fmt == "teams":
        return {
            "@type": "MessageCard",
            "@context": "https://schema.org/extensions",
            "summary": _clip(text, 200),
            "themeColor": f"{COLOUR_FAILED if failed(fields) else COLOUR_OK:06X}",
            "title": title,
            "text": text,
            "sections": [{"facts": [{"name": n, "value": v} for n, v in _facts(fields)]}],
        }
    return {
        "text": text,
        "event": fields["event"],
        "event_id": fields["event_id"],
        "job_id": fields["job_id"],
        "job_type": enriched.job_type,
        "status": fields["status"] or None,
        "item_name": fields["item_name"] or None,
        "error": fields["error"] or None,
        "asset_urls": asset_urls(enriched) if fields["event"] == "job.completed" else {},
    }


class ChatSink:
    """Posts a message per event. Options: ``url``, ``format``, ``template``."""

    def __init__(self, settings: SinkSettings, *, session: aiohttp.ClientSession) -> None:
        options = settings.options
        self.name = settings.name
        self.settings = settings
        self._url = str(options["url"])
        self.format = str(options.get("format") or "slack")
        self.template: str | None = options.get("template")
        self._shown_url = origin(self._url)
        self._session = session

    async def open(self) -> None:
        """Nothing to open: requests use the process's shared HTTP session."""

    async def close(self) -> None:
        """Nothing to close."""

    async def send(self, enriched: Enriched) -> int:
        """Post the message; raise a DeliveryError unless the hook took it."""
        body = build_message(self.format, enriched, self.template)
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", **trace_headers(enriched)}
        return await post(
            self._session,
            self._url,
            data,
            headers,
            shown_url=self._shown_url,
            is_permanent=lambda s: 400 <= s < 500 and s not in _RETRYABLE_4XX,
        )


def create(settings: SinkSettings, context: SinkContext) -> ChatSink:
    return ChatSink(settings, session=context.session)
