"""How much of what the spec allows the simulator puts in each object it shows.

The upstream's specification (``upstream-api-spec.md``) guarantees little: a webhook body has
only ``id``, ``object``, ``event`` and ``job_id`` for sure; a job's ``item_id``, ``item_name``,
``error`` and ``urls`` are optional; an asset's ``metadata`` and ``collection_id`` are optional
and nullable, its ``item_id``, ``file_url`` and ``cdn_url`` nullable; list endpoints may use a
smaller page than asked for; unknown fields may appear anywhere. A stand-in that always sends
everything lets a receiver lean on fields the upstream never promised, so by default the
simulator varies them.

Shapes:

- ``full``: every field present and filled (the most the spec allows);
- ``minimal``: every optional field absent and every nullable one null, webhook bodies with
  only the four guaranteed fields (the least the spec allows);
- ``mixed`` (default): per object and per field, present, null or absent as the spec allows,
  some webhook bodies minimal, unknown extra fields here and there, list pages of varying size.

Choices are a pure function of the seed, the object's id and the field, so an object looks the
same every time it is shown and a failing run repeats with the same ``--seed``.

Two fields keep what the spec's words give them even in ``minimal``: a *completed* asset always
has its ``file_url`` (a signed URL is what the asset is for; a null one reads as "not ready"),
and a failed job keeps its ``error`` in ``full``/``mixed`` only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Literal

ShapeName = Literal["full", "minimal", "mixed"]
SHAPES: tuple[ShapeName, ...] = ("full", "minimal", "mixed")
DEFAULT_SHAPE: ShapeName = "mixed"

#: What ``mixed`` decides for a field: keep it, make it null, or leave it out.
PRESENT, NULL, ABSENT = "present", "null", "absent"

#: The webhook body's fields the spec guarantees.
GUARANTEED_EVENT_FIELDS = ("id", "object", "event", "job_id")
#: The webhook body's fields beyond the four guaranteed ones.
EVENT_OPTIONAL = ("type", "mascot_id", "asset_ids", "urls", "timestamp")
#: Job fields that are optional (and nullable, except ``urls``); ``collection_id`` is required
#: but nullable.
JOB_OPTIONAL_NULLABLE = ("item_id", "item_name", "error")
JOB_OPTIONAL = ("urls",)
JOB_NULLABLE = ("collection_id",)
#: Asset fields: optional and nullable; required but nullable; optional only.
ASSET_OPTIONAL_NULLABLE = ("metadata", "collection_id", "archived_at")
ASSET_NULLABLE = ("item_id", "cdn_url")
ASSET_OPTIONAL = ("is_archived",)

_EXTRA_FIELDS: tuple[tuple[str, Any], ...] = (
    ("x_request_region", "eu-west-1"),
    ("schema_revision", "1.14.0"),
    ("labels", {"tier": "standard", "experimental": False}),
    ("score", 0.93),
    ("deprecated_field", None),
)


class Shape:
    """Decides, for one simulator, which optional fields each object carries."""

    def __init__(self, name: ShapeName = DEFAULT_SHAPE, *, seed: int = 0) -> None:
        if name not in SHAPES:
            raise ValueError(f"unknown shape {name!r}; expected one of {', '.join(SHAPES)}")
        self.name: ShapeName = name
        self._seed = seed
        #: Decisions pinned for every object: ``("asset", "metadata") -> "null"``.
        self.pinned: dict[tuple[str, str], str] = {}

    def pin(self, kind: str, field: str, decision: str) -> None:
        """Make ``field`` of every ``kind`` object (``event``, ``job``, ``asset``) ``present``,
        ``null`` or ``absent``, whatever the shape (a test's upstream that always does so)."""
        if decision not in (PRESENT, NULL, ABSENT):
            raise ValueError(f"unknown decision {decision!r}")
        self.pinned[kind, field] = decision

    def _draw(self, object_id: str, what: str) -> int:
        digest = hashlib.blake2b(
            f"{self._seed}:{object_id}:{what}".encode(), digest_size=4
        ).digest()
        return int.from_bytes(digest, "big")

    def choice(
        self, kind: str, object_id: str, field: str, *, nullable: bool, optional: bool
    ) -> str:
        """``present``, ``null`` or ``absent`` for ``field`` of the ``kind`` object
        ``object_id``."""
        pinned = self.pinned.get((kind, field))
        if pinned is not None:
            return pinned
        if self.name == "full":
            return PRESENT
        if self.name == "minimal":
            return ABSENT if optional else (NULL if nullable else PRESENT)
        options = [PRESENT, PRESENT]  # present half the time: most objects keep most fields
        if nullable:
            options.append(NULL)
        if optional:
            options.append(ABSENT)
        return options[self._draw(object_id, field) % len(options)]

    def chance(self, object_id: str, what: str, fraction: float) -> bool:
        """A stable yes for ``fraction`` of objects in ``mixed`` (never in the other shapes)."""
        if self.name != "mixed":
            return False
        return self._draw(object_id, what) % 1000 < fraction * 1000

    def apply(
        self,
        kind: str,
        data: dict[str, Any],
        object_id: str,
        *,
        optional: Iterable[str] = (),
        nullable: Iterable[str] = (),
        optional_nullable: Iterable[str] = (),
    ) -> dict[str, Any]:
        """``data`` with each named field kept, nulled or removed, and in ``mixed`` now and then
        an unknown extra field or two."""
        for fields, is_nullable, is_optional in (
            (optional, False, True),
            (nullable, True, False),
            (optional_nullable, True, True),
        ):
            for field in fields:
                decision = self.choice(
                    kind, object_id, field, nullable=is_nullable, optional=is_optional
                )
                if decision == NULL:
                    data[field] = None
                elif decision == ABSENT:
                    data.pop(field, None)
        return self.with_extras(data, object_id)

    def with_extras(self, data: dict[str, Any], object_id: str) -> dict[str, Any]:
        """Unknown fields the spec allows a client to meet (``mixed`` only, a third of
        objects)."""
        if self.chance(object_id, "extras", 1 / 3):
            name, value = _EXTRA_FIELDS[self._draw(object_id, "extra") % len(_EXTRA_FIELDS)]
            data.setdefault(name, value)
        return data

    def event_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A webhook body as this shape sends it: sometimes only the guaranteed four fields."""
        object_id = str(body.get("id"))
        if self.name == "minimal" or self.chance(object_id, "minimal-event", 0.25):
            kept = {
                f for (kind, f), how in self.pinned.items() if kind == "event" and how != ABSENT
            }
            body = {k: v for k, v in body.items() if k in GUARANTEED_EVENT_FIELDS or k in kept}
        return self.apply("event", body, object_id, optional=EVENT_OPTIONAL)

    def page_limit(self, object_id: str, requested: int) -> int:
        """The page size a list answers with: at most what was asked, smaller now and then
        (``meta.pagination.limit`` says which, as the spec has it)."""
        if self.chance(object_id, "page-limit", 0.5):
            return max(1, 1 + self._draw(object_id, "page-size") % requested)
        return requested
