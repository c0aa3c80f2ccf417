"""The inbox pages for an incident: redelivery batches (preview, start, progress, cancel) and
the overview's pause and resume buttons on each lane.

A batch is previewed on the dead-letters page (its form is a GET: a preview changes nothing),
started with a POST that stores it (:func:`receiver.delivery.redelivery.start`) and answered with a
redirect to its progress page, which refreshes itself until the batch is done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from receiver.config.settings import Settings
from receiver.delivery import pauses, redelivery
from receiver.humantime import parse_duration
from receiver.logs import get_logger
from receiver.store.base import Store
from receiver.store.batches import REDELIVERY_STATUSES, BadFilter, RedeliveryPreview, UnknownBatch
from receiver.web.render import View, redirect, render

log = get_logger("receiver.web")

BY = "inbox page"
SAMPLE = 10
#: The pause lengths the overview offers ("" = until resumed).
PAUSE_CHOICES = (("", "until resumed"), ("15m", "15 min"), ("1h", "1 hour"), ("4h", "4 hours"))
FORM_FIELDS = ("status", "sink", "event", "job_id", "since", "until")


def form_values(source: Mapping[str, Any]) -> dict[str, str]:
    """The batch form's fields as given (to fill the form again), ``status`` dead by default."""
    values = {name: str(source.get(name, "") or "").strip() for name in FORM_FIELDS}
    values["status"] = values["status"] or "dead"
    return values


def filter_data(values: Mapping[str, str]) -> dict[str, Any]:
    """The form's values as the filter's JSON fields (empty ones left out)."""
    data: dict[str, Any] = {k: v for k, v in values.items() if v and k != "sink"}
    if values.get("sink"):
        data["sinks"] = [values["sink"]]
    return data


class IncidentPages:
    """Handlers of the batch pages and the lane buttons (guarded by :class:`InboxUi`)."""

    def __init__(
        self,
        *,
        store: Store,
        settings: Settings,
        on_change: Callable[[], None],
    ) -> None:
        self._store = store
        self._settings = settings
        self._on_change = on_change
        self.sinks: Sequence[str] = [s.name for s in settings.sinks]

    async def preview(
        self, query: Mapping[str, str], now: float
    ) -> tuple[dict[str, str], RedeliveryPreview | None, str | None]:
        """The dead-letters page's batch form: its values, and with ``?preview`` what the
        batch would select now (or why the filter is wrong)."""
        values = form_values(query)
        if "preview" not in query:
            return values, None, None
        try:
            flt = redelivery.read_filter(filter_data(values), sinks=self.sinks, now=now)
        except BadFilter as exc:
            return values, None, str(exc)
        return values, await self._store.preview_redelivery(flt, now=now, sample=SAMPLE), None

    def form_context(self) -> dict[str, Any]:
        return {"statuses": REDELIVERY_STATUSES, "sinks": self.sinks}

    async def start(self, request: web.Request, view: View) -> web.StreamResponse:
        values = form_values(await request.post())
        try:
            flt = redelivery.read_filter(filter_data(values), sinks=self.sinks, now=view.now)
        except BadFilter as exc:
            return render(view, "error.html", status=400, title="Bad filter", message=str(exc))
        batch = await redelivery.start(self._store, flt, created_by=BY, now=view.now)
        self._on_change()
        return redirect(request.app.router["redelivery"].url_for(id=batch.id))

    async def batches(self, _request: web.Request, view: View) -> web.Response:
        found = await self._store.redeliveries(limit=100)
        return render(view, "redeliveries.html", title="Redeliveries", batches=found)

    async def batch(self, request: web.Request, view: View) -> web.Response:
        batch = await self._store.redelivery(request.match_info["id"])
        if batch is None:
            return render(
                view, "error.html", status=404, title="Not found", message="No such batch."
            )
        return render(
            view,
            "redelivery.html",
            title=f"Redelivery {batch.id}",
            batch=batch,
            started=request.query.get("started"),
        )

    async def cancel(self, request: web.Request, view: View) -> web.StreamResponse:
        batch_id = request.match_info["id"]
        try:
            await self._store.cancel_redelivery(batch_id, now=view.now)
        except UnknownBatch:
            return render(
                view, "error.html", status=404, title="Not found", message="No such batch."
            )
        log.info("redelivery batch cancelled on the inbox page", batch=batch_id)
        return redirect(request.app.router["redelivery"].url_for(id=batch_id))

    # -- lanes ----------------------------------------------------------------------------------

    async def pause(self, request: web.Request, view: View) -> web.StreamResponse:
        form = await request.post()
        length = str(form.get("for", "") or "")
        reason = str(form.get("reason", "") or "").strip() or None
        try:
            seconds = parse_duration(length) if length else None
            seconds, reason = pauses.pause_terms(seconds, reason)
            await pauses.pause(
                self._store,
                self._settings,
                request.match_info["name"],
                seconds=seconds,
                reason=reason,
                by=BY,
                now=view.now,
            )
        except pauses.UnknownLane as exc:
            return render(view, "error.html", status=404, title="Not found", message=str(exc))
        except (pauses.BadPause, ValueError) as exc:
            return render(view, "error.html", status=400, title="Not paused", message=str(exc))
        return redirect(request.app.router["overview"].url_for())

    async def resume(self, request: web.Request, view: View) -> web.StreamResponse:
        try:
            await pauses.resume(
                self._store, self._settings, request.match_info["name"], by=BY, now=view.now
            )
        except pauses.UnknownLane as exc:
            return render(view, "error.html", status=404, title="Not found", message=str(exc))
        self._on_change()
        return redirect(request.app.router["overview"].url_for())
