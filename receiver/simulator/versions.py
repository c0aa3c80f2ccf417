"""The simulated upstream's versions: its OpenAPI document, the ``Service-API-Version`` it
accepts, the retirement notices of its job endpoint, and job statuses outside the spec.

Switches (plain attributes of :class:`UpstreamVersions`, read on every request; ``receiver
simulate`` sets them from its flags through :class:`VersionFaults`):

- ``api_versions``: the dated versions accepted in ``Service-API-Version``; a request without
  the header, or with another value, answers 400 ``validation_failed`` with
  ``param: "Service-API-Version"`` and a message naming the version. ``None`` (the class
  default) checks nothing.
- ``spec_drift``: what ``GET /v1/openapi.json`` serves (:meth:`UpstreamVersions.openapi_document`):
  ``none``, the revision the receiver was built against (its shipped baseline document);
  ``notice``, a newer revision marking ``GET /jobs/{id}`` ``deprecated``; ``breaking``, that and
  a job status enum gaining ``queued`` and the job's ``item_name`` removed.
- ``jobs_deprecated`` and ``jobs_sunset_at``: answers of ``GET /v1/jobs/{id}`` carry
  ``Deprecation`` (RFC 9745) and ``Sunset`` (RFC 8594, an HTTP date) with their ``Link``.
- ``unknown_status_fraction`` and ``unknown_status_jobs``: those jobs report the status
  ``queued``, none of the spec's four, for good (their assets and webhooks are unchanged).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from email.utils import formatdate
from importlib import resources
from typing import Any

from receiver.simulator.state import SimulatorState

VERSION_HEADER = "Service-API-Version"
#: The dates of the spec's change history: the versions the simulator accepts by default.
KNOWN_API_VERSIONS = (
    "2025-12-01",
    "2026-04-10",
    "2026-04-19",
    "2026-05-16",
    "2026-05-23",
    "2026-08-20",
)
SPEC_DRIFTS = ("none", "notice", "breaking")
OPENAPI_PATH = "/v1/openapi.json"
UNKNOWN_JOB_STATUS = "queued"
#: When the job endpoint counts as deprecated (``Deprecation: @...``): 2026-08-20 00:00 UTC.
JOBS_DEPRECATED_AT = 1787184000
DEPRECATION_LINK = "https://docs.example.invalid/deprecations/jobs"
SUNSET_LINK = "https://docs.example.invalid/sunset/jobs"
_DRIFT_REVISIONS = {"notice": "1.15.0", "breaking": "1.16.0"}
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_JOB_PATH = re.compile(r"(/v1)?/jobs/\{[^}]+\}")


def baseline_document() -> dict[str, Any]:
    """The upstream revision the receiver was built against (shipped with the receiver)."""
    text = resources.files("receiver.upstream").joinpath("spec/baseline.json").read_text("utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


class UpstreamVersions(SimulatorState):
    """:class:`SimulatorState` with the version switches of the module docstring."""

    api_versions: frozenset[str] | None = None
    spec_drift: str = "none"
    jobs_deprecated: bool = False
    jobs_sunset_at: float | None = None
    unknown_status_fraction: float = 0.0
    unknown_status_jobs: frozenset[str] = frozenset()

    def openapi_document(self) -> dict[str, Any]:
        """The document ``GET /v1/openapi.json`` serves now (see ``spec_drift``)."""
        document = baseline_document()
        if self.spec_drift not in _DRIFT_REVISIONS:
            return document
        document["info"]["version"] = _DRIFT_REVISIONS[self.spec_drift]
        item = _job_operation(document)
        item["get"]["deprecated"] = True
        if self.spec_drift == "breaking":
            job = _answer_data(document, item["get"])
            job["properties"]["status"]["enum"].append(UNKNOWN_JOB_STATUS)
            del job["properties"]["item_name"]
            job["required"] = [name for name in job.get("required", []) if name != "item_name"]
        return document

    def version_refusal(self, value: str | None) -> str | None:
        """Why a request with ``Service-API-Version: value`` is refused, or None."""
        accepted = self.api_versions
        if accepted is None:
            return None
        known = ", ".join(sorted(accepted))
        if value is None or not value.strip():
            return f"The {VERSION_HEADER} header is required: a dated version ({known})."
        version = value.strip()[:40]
        if version not in accepted:
            return f"{VERSION_HEADER} {version} is not a version this service knows ({known})."
        return None

    def job_endpoint_headers(self) -> dict[str, str]:
        """The retirement notices every answer of ``GET /v1/jobs/{id}`` carries now."""
        headers: dict[str, str] = {}
        links = []
        if self.jobs_deprecated:
            headers["Deprecation"] = f"@{JOBS_DEPRECATED_AT}"
            links.append(f'<{DEPRECATION_LINK}>; rel="deprecation"; type="text/html"')
        if self.jobs_sunset_at is not None:
            headers["Sunset"] = formatdate(self.jobs_sunset_at, usegmt=True)
            links.append(f'<{SUNSET_LINK}>; rel="sunset"')
        if links:
            headers["Link"] = ", ".join(links)
        return headers

    def reports_unknown_status(self, job_id: str) -> bool:
        """Whether the job shows the status ``queued`` (see ``unknown_status_fraction``)."""
        if job_id in self.unknown_status_jobs:
            return True
        if self.unknown_status_fraction <= 0:
            return False
        draw = int.from_bytes(hashlib.sha256(f"unknown-status:{job_id}".encode()).digest()[:4])
        return draw % 1000 < self.unknown_status_fraction * 1000

    def job_json(self, job_id: str, base_url: str | None = None) -> dict[str, Any]:
        data = super().job_json(job_id, base_url)
        if self.reports_unknown_status(job_id):
            data["status"] = UNKNOWN_JOB_STATUS
            if "urls" in data:
                data["urls"] = {}
        return data


def _job_operation(document: dict[str, Any]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = document["paths"]
    for path, item in paths.items():
        if _JOB_PATH.fullmatch(path) and "get" in item:
            return item
    raise LookupError("the baseline document has no GET /jobs/{id}")


def _answer_data(document: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    """The schema of the success answer's ``data`` (the Job), followed through local refs."""
    content = operation["responses"]["200"]["content"]["application/json"]
    answer = _resolve(document, content["schema"])
    return _resolve(document, answer["properties"]["data"])


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = document
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


@dataclass(frozen=True)
class VersionFaults:
    """The version switches ``receiver simulate`` was given (see the module docstring)."""

    api_versions: tuple[str, ...] | None = None  # None: any version, or none, is accepted
    spec_drift: str = "none"
    deprecate_jobs: bool = False
    sunset_days: float | None = None  # the job endpoint's Sunset, this long after the start
    unknown_status_fraction: float = 0.0

    def problems(self) -> list[str]:
        """What is wrong with these switches, one sentence each naming the flag."""
        problems = []
        if self.api_versions is not None and (
            not self.api_versions or not all(_DATE.fullmatch(v) for v in self.api_versions)
        ):
            problems.append("--api-versions takes comma-separated dates (YYYY-MM-DD) or any")
        if self.spec_drift not in SPEC_DRIFTS:
            problems.append(f"--spec-drift is one of {', '.join(SPEC_DRIFTS)}")
        if self.sunset_days is not None and self.sunset_days < 0:
            problems.append("--sunset-days must be 0 or more")
        if not 0 <= self.unknown_status_fraction <= 1:
            problems.append("--unknown-status is a fraction between 0 and 1")
        return problems

    def apply(self, sim: UpstreamVersions) -> None:
        """Set the simulator's switches (the sunset counted from the simulator's now)."""
        sim.api_versions = None if self.api_versions is None else frozenset(self.api_versions)
        sim.spec_drift = self.spec_drift
        sim.jobs_deprecated = self.deprecate_jobs
        sim.jobs_sunset_at = (
            None if self.sunset_days is None else round(sim.now() + self.sunset_days * 86400)
        )
        sim.unknown_status_fraction = self.unknown_status_fraction
