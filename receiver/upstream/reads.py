"""What the receiver reads of the upstream: the operations it calls and the fields it uses.

This is the one declaration that the drift check (:mod:`receiver.upstream.drift`) compares the
upstream's OpenAPI document on, and that fetched answers are checked against
(:mod:`receiver.upstream.conformance`). Nothing outside it matters: a change to a part of the
upstream the receiver never reads is no change.

- The API client takes its route templates from the operations below, so a call to a route
  not declared here does not exist. A unit test (``tests/unit/test_upstream_reads.py``) reads
  the client's source and fails when a request's method and route are not an operation here.
- Each object lists the fields the receiver reads. The same test reads the source of every
  module that handles an upstream object (the webhook body, a job, an asset, a page, a
  subscription, an error body) and fails when a field is read there (``obj.get("name")`` or
  ``obj["name"]``) without being declared on its object here.

A field is a path inside its object: ``metadata.job_id``; ``*`` stands for each value of a map
(``urls.*``), ``[]`` for each entry of a list (``events[]``). ``types`` are the JSON types the
receiver copes with there (``null`` included where it copes with a null; an ``integer`` is a
``number``). ``acts_on`` names the values the receiver takes a decision on (a job's ``status``
decides whether an event waits; an asset is ready only when ``completed``): a value the
upstream adds there is a breaking change, while a new value of a field only passed along (a
job's ``type``) is not. ``promised=False`` marks a member the upstream's specification does not
name but the receiver reads when present (and its own events' members): it is never compared
or checked.

An operation says where its answer's objects are (``data``, each entry ``data[]`` of a list, or
the whole envelope for a page), and which parameters the receiver sends, so that a parameter the
upstream newly requires is a breaking change only when the receiver does not send it.
"""

from __future__ import annotations

from dataclasses import dataclass

STRING = frozenset({"string"})
NULLABLE_STRING = frozenset({"string", "null"})
BOOLEAN = frozenset({"boolean"})
NUMBER = frozenset({"number"})
INTEGER = frozenset({"integer"})
OBJECT = frozenset({"object"})
ARRAY = frozenset({"array"})


@dataclass(frozen=True)
class Field:
    """One field the receiver reads (see the module docstring)."""

    path: str
    types: frozenset[str]
    acts_on: frozenset[str] = frozenset()
    promised: bool = True

    @property
    def steps(self) -> tuple[str, ...]:
        """The path as steps: ``data[].status`` is ``("data", "[]", "status")``."""
        return split_path(self.path)


@dataclass(frozen=True)
class UpstreamObject:
    """An object of the upstream's and the fields of it the receiver reads."""

    name: str
    fields: tuple[Field, ...]

    def field(self, path: str) -> Field:
        for field in self.fields:
            if field.path == path:
                return field
        raise KeyError(f"{self.name} has no field {path!r} declared")

    @property
    def promised(self) -> tuple[Field, ...]:
        """The fields the upstream's specification names: the ones compared and checked."""
        return tuple(f for f in self.fields if f.promised)


def split_path(path: str) -> tuple[str, ...]:
    """``data[].status`` as ``("data", "[]", "status")``; ``""`` as ``()``."""
    steps: list[str] = []
    for part in path.split(".") if path else ():
        name, brackets = part.split("[]", 1)[0], part.count("[]")
        steps.extend([name] if name else [])
        steps.extend(["[]"] * brackets)
    return tuple(steps)


def join_path(steps: tuple[str, ...]) -> str:
    """The inverse of :func:`split_path`."""
    text = ""
    for step in steps:
        text += step if step == "[]" or not text else f".{step}"
    return text


# --- the objects ------------------------------------------------------------------------------

WEBHOOK_BODY = UpstreamObject(
    "webhook body",
    (
        Field("id", STRING),
        Field("object", STRING),
        Field("event", STRING),
        Field("job_id", STRING),
        Field("type", STRING),
        Field("asset_ids", OBJECT),
        Field("asset_ids.*", STRING),
        # The receiver's own events (pull mode, reconcile) carry these; no webhook does.
        Field("source", STRING, promised=False),
        Field("reconcile_unit", STRING, promised=False),
        Field("collection_id", STRING, promised=False),
        Field("item_id", STRING, promised=False),
    ),
)

JOB_STATUSES = frozenset({"pending", "processing", "completed", "failed"})

JOB = UpstreamObject(
    "job",
    (
        Field("id", STRING),
        Field("status", STRING, acts_on=JOB_STATUSES),
        Field("type", STRING),
        Field("collection_id", NULLABLE_STRING),
        Field("item_id", NULLABLE_STRING),
        Field("item_name", NULLABLE_STRING),
        Field("error", NULLABLE_STRING),
        Field("urls", OBJECT),
        Field("urls.*", STRING),
        Field("updated_at", STRING),
    ),
)

ASSET = UpstreamObject(
    "asset",
    (
        Field("id", STRING),
        Field("type", STRING),
        Field("status", STRING, acts_on=frozenset({"completed"})),
        Field("file_url", NULLABLE_STRING),
        Field("cdn_url", NULLABLE_STRING),
        Field("item_id", NULLABLE_STRING),
        Field("collection_id", NULLABLE_STRING),
        Field("metadata", frozenset({"object", "null"})),
        Field("is_archived", BOOLEAN),
        Field("created_at", STRING),
        # Some upstreams name the job that made an asset; the specification does not.
        Field("metadata.job_id", STRING, promised=False),
        Field("job_id", STRING, promised=False),
    ),
)

_PAGINATION = (
    Field("meta.pagination.has_more", BOOLEAN),
    Field("meta.pagination.limit", INTEGER),
    Field("meta.pagination.offset", INTEGER),
)

ASSET_PAGE = UpstreamObject(
    "asset page",
    (Field("data", ARRAY), *_PAGINATION, Field("meta.pagination.total", INTEGER)),
)

WEBHOOK_LIST = UpstreamObject("webhook list", (Field("data", ARRAY), *_PAGINATION))

WEBHOOK = UpstreamObject(
    "webhook",
    (
        Field("id", STRING),
        Field("url", STRING),
        Field("events", ARRAY),
        Field("events[]", STRING),
        Field("active", BOOLEAN),
        Field("consecutive_failures", NUMBER),
    ),
)

CREATED_WEBHOOK = UpstreamObject(
    "created webhook",
    (
        Field("id", STRING),
        Field("secret", STRING),
        Field("url", STRING),
        Field("events", ARRAY),
        Field("events[]", STRING),
    ),
)

ERROR = UpstreamObject(
    "error",
    (Field("code", STRING), Field("message", STRING), Field("param", STRING)),
)

OBJECTS = (WEBHOOK_BODY, JOB, ASSET, ASSET_PAGE, WEBHOOK_LIST, WEBHOOK, CREATED_WEBHOOK, ERROR)


# --- the operations ---------------------------------------------------------------------------

#: Sent with every request (``Content-Type`` with a body).
ALWAYS_SENT = frozenset(
    {
        "header:authorization",
        "header:accept",
        "header:user-agent",
        "header:service-api-version",
        "header:content-type",
    }
)


@dataclass(frozen=True)
class Operation:
    """One upstream call: its method, its route under ``{base_url}``, the parameters the receiver
    sends (``query:wait``, ``body:url``) and where the objects it reads are in the answer."""

    method: str
    route: str
    sends: frozenset[str] = frozenset()
    answers: tuple[tuple[UpstreamObject, str], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.method} {self.route}"


GET_JOB = Operation(
    "GET", "/jobs/{id}", frozenset({"query:wait", "query:timeout"}), ((JOB, "data"),)
)
GET_ASSET = Operation("GET", "/assets/{id}", answers=((ASSET, "data"),))
LIST_COLLECTION_ASSETS = Operation(
    "GET",
    "/collections/{id}/assets",
    frozenset({"query:limit", "query:offset"}),
    ((ASSET_PAGE, ""), (ASSET, "data[]")),
)
LIST_WEBHOOKS = Operation(
    "GET",
    "/webhooks",
    frozenset({"query:limit", "query:offset"}),
    ((WEBHOOK_LIST, ""), (WEBHOOK, "data[]")),
)
CREATE_WEBHOOK = Operation(
    "POST", "/webhooks", frozenset({"body:url", "body:events"}), ((CREATED_WEBHOOK, "data"),)
)
DELETE_WEBHOOK = Operation("DELETE", "/webhooks/{id}")

OPERATIONS = (
    GET_JOB,
    GET_ASSET,
    LIST_COLLECTION_ASSETS,
    LIST_WEBHOOKS,
    CREATE_WEBHOOK,
    DELETE_WEBHOOK,
)

# The route templates the API client requests (and labels its metrics with).
JOB_ENDPOINT = GET_JOB.route
ASSET_ENDPOINT = GET_ASSET.route
COLLECTION_ASSETS_ENDPOINT = LIST_COLLECTION_ASSETS.route
WEBHOOKS_ENDPOINT = LIST_WEBHOOKS.route
WEBHOOK_ENDPOINT = DELETE_WEBHOOK.route
