"""Structured logging: JSON lines when stderr is not a terminal, readable lines when it is.

``event_id``, ``job_id`` and ``sink`` are bound with :func:`structlog.contextvars.bind_contextvars`
by the code handling an event, so every line it logs carries them. A last processor removes the
query string from any URL in a logged value: signed file URLs carry their signature there.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import structlog

Processor = Callable[[Any, str, MutableMapping[str, Any]], MutableMapping[str, Any]]

_URL_QUERY = re.compile(r"(https?://[^\s?#\"']+)\?[^\s#\"']*")
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def redact_url(url: str) -> str:
    """The URL without its query string and fragment (signed URLs carry secrets there)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
    else:
        netloc = parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_query_strings(text: str) -> str:
    """``text`` with the query string of every http(s) URL in it replaced by ``<redacted>``."""
    return _URL_QUERY.sub(r"\1?<redacted>", text) if "://" in text else text


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact_query_strings(value)
    return value


def scrub_urls(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: strip query strings from URLs anywhere in the line."""
    return {key: _scrub(value) for key, value in event_dict.items()}


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Set up structlog for the process (idempotent)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            scrub_urls,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries log through the standard library: send those lines through structlog too, as
    # one line each. aiohttp logs every malformed request a client sends with its traceback;
    # that is the client's mistake, worth a line, never a traceback on stderr.
    root = logging.getLogger()
    root.handlers = [_OneLineHandler()]
    root.setLevel(max(_LEVELS.get(level, logging.INFO), logging.INFO))


class _OneLineHandler(logging.Handler):
    """A standard-library record as one structlog line; an exception as its type and message."""

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = {}
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            fields["error"] = f"{type(exc).__name__}: {exc}"
        logger = structlog.get_logger(logger_name=record.name)
        name = record.levelname.lower()
        if record.name == "aiohttp.server" and record.levelno > logging.WARNING:
            name = "warning"  # a request too malformed to parse: the client's mistake
        method = getattr(logger, name, logger.warning)
        try:
            method(record.getMessage(), **fields)
        except Exception:  # logging must never raise into the caller
            self.handleError(record)


def add_processor(processor: Processor) -> None:
    """Add ``processor`` to the chain, before the URL scrubbing and rendering (idempotent)."""
    processors = list(structlog.get_config()["processors"])
    if processor in processors:
        return
    at = processors.index(scrub_urls) if scrub_urls in processors else max(0, len(processors) - 1)
    processors.insert(at, processor)
    structlog.configure(processors=processors)


def remove_processor(processor: Processor) -> None:
    """Take ``processor`` out of the chain again."""
    processors = [p for p in structlog.get_config()["processors"] if p is not processor]
    structlog.configure(processors=processors)


def get_logger(name: str) -> Any:
    """A structlog logger carrying ``logger_name=name``."""
    return structlog.get_logger(logger_name=name)
