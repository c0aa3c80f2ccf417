"""The inbox pages: overview, events, one event, dead letters, and the redeliver actions (each a
redelivery batch, :mod:`receiver.delivery.redelivery`; the batch pages are
:mod:`receiver.web.incident`).

Each handler gets the request and the :class:`~receiver.web.render.View` the guard built for it
(see :mod:`receiver.web.ui`); reads are GETs, every change is a POST answered with a redirect
(303) to the page that shows its result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from receiver.config.settings import SinkSettings
from receiver.delivery.redelivery import redeliver_event, start
from receiver.errors import UnknownEvent
from receiver.logs import get_logger
from receiver.observe.metrics import Metrics
from receiver.store.base import Store
from receiver.store.batches import RedeliveryFilter
from receiver.store.browse import Cursor
from receiver.store.records import EventRecord
from receiver.upstream.status import UpstreamSide
from receiver.web import timeline
from receiver.web.filters import DELIVERY_STATES, BadFilter, parse_events_request
from receiver.web.incident import BY, PAUSE_CHOICES, IncidentPages
from receiver.web.lanes import DeliveryRates, gauge_counts, lane_rows
from receiver.web.render import View, group_key, redirect, render
from receiver.web.upstream import api_section, subscriptions_section

log = get_logger("receiver.web")

PAGE_SIZE = 50
FAILING_WINDOW_SECONDS = 3600.0
RECENT_ERRORS = 10
KNOWN_EVENTS = ("job.completed", "job.failed")


def not_found(view: View, what: str) -> web.Response:
    return render(view, "error.html", status=404, title="Not found", message=what)


def job_snapshot(record: EventRecord) -> dict[str, Any] | None:
    """The job and assets fetched for the event, when the store keeps them with it: ``data``
    (``{"job": ..., "assets": [...]}``), ``fetched_at``; or, while none was fetched, the last
    fetch error (``error``, ``attempts``) when there was one."""
    snapshot = getattr(record, "snapshot", None)
    if snapshot is not None:
        data = {"job": snapshot.job, "assets": list(snapshot.assets)}
        return {"data": data, "fetched_at": snapshot.fetched_at}
    error = getattr(record, "enrich_error", None)
    if error:
        return {"error": error, "attempts": getattr(record, "enrich_attempts", 0)}
    return None


class Pages:
    """The page handlers, over one store (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        metrics: Metrics,
        sinks: Sequence[SinkSettings],
        upstream: UpstreamSide | None,
        on_redeliver: Callable[[], None],
        incident: IncidentPages,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._sinks = tuple(sinks)
        self._upstream = upstream
        self._on_redeliver = on_redeliver
        self._incident = incident
        self._rates = DeliveryRates(metrics)
        self.page_size = page_size

    # -- reading --------------------------------------------------------------------------------

    async def overview(self, _request: web.Request, view: View) -> web.Response:
        counts, oldest_pending = gauge_counts(self._metrics, view.now) or await self._store.counts()
        overview = await self._store.overview(
            now=view.now, failing_since=view.now - FAILING_WINDOW_SECONDS, errors=RECENT_ERRORS
        )
        lanes = lane_rows(
            overview,
            sinks=self._sinks,
            states=await self._store.lane_states(),
            rates=self._rates,
            now=view.now,
        )
        return render(
            view,
            "overview.html",
            title="Overview",
            counts=counts,
            oldest_pending=oldest_pending,
            lanes=lanes,
            errors=overview.recent_errors,
            upstream=subscriptions_section(self._upstream),
            upstream_api=api_section(self._upstream),
            pause_choices=PAUSE_CHOICES,
        )

    async def events(self, request: web.Request, view: View) -> web.Response:
        try:
            asked = parse_events_request(request.query)
        except BadFilter as exc:
            return render(view, "error.html", status=400, title="Bad filter", message=str(exc))
        size = self.page_size
        rows = await self._store.browse(
            asked.query, before=asked.before, after=asked.after, limit=size + 1
        )
        if asked.after is not None:
            page, newer, older = rows[-size:], len(rows) > size, True
        else:
            page, newer, older = rows[:size], asked.before is not None, len(rows) > size
        links = {
            "newest": asked.link() if newer else None,
            "newer": asked.link(after=_cursor(page[0])) if newer and page else None,
            "older": asked.link(before=_cursor(page[-1])) if older and page else None,
        }
        return render(
            view,
            "events.html",
            title="Events",
            events=page,
            values=asked.values,
            links=links,
            sinks=[s.name for s in self._sinks],
            states=DELIVERY_STATES,
            event_names=KNOWN_EVENTS,
            filtered=any(asked.values.values()),
        )

    async def event(self, request: web.Request, view: View) -> web.Response:
        record = await self._store.get(request.match_info["id"])
        if record is None:
            return not_found(view, "No event with that id is in the inbox.")
        return render(
            view,
            "event.html",
            title=f"Event {record.id}",
            event=record,
            snapshot=job_snapshot(record),
            timeline=timeline.build(record, await self._store.event_steps(record.id)),
            redelivered=request.query.get("redelivered"),
        )

    async def dead(self, request: web.Request, view: View) -> web.Response:
        groups = await self._store.dead_letters()
        values, preview, problem = await self._incident.preview(request.query, view.now)
        return render(
            view,
            "dead.html",
            title="Dead letters",
            groups=groups,
            total=sum(g.count for g in groups),
            values=values,
            preview=preview,
            problem=problem,
            **self._incident.form_context(),
        )

    # -- changing -------------------------------------------------------------------------------

    async def redeliver(self, request: web.Request, view: View) -> web.StreamResponse:
        event_id = request.match_info["id"]
        sink = str((await request.post()).get("sink", "")) or None
        try:
            batch = await redeliver_event(
                self._store, event_id, sink=sink, created_by=BY, now=view.now
            )
        except UnknownEvent:
            return not_found(view, "No such event, or it has no delivery to that sink.")
        log.info("redelivery asked on the inbox page", event_id=event_id, sink=sink, batch=batch.id)
        self._on_redeliver()
        location = request.app.router["event"].url_for(id=event_id)
        return redirect(location.with_query(redelivered=str(batch.queued)))

    async def redeliver_dead(self, request: web.Request, view: View) -> web.StreamResponse:
        """Every dead delivery, or one group of them (same sink, same last error), again: a
        batch, whose progress page answers."""
        key = str((await request.post()).get("group", ""))
        flt = RedeliveryFilter(status="dead")
        if key:
            groups = await self._store.dead_letters()
            group = next((g for g in groups if group_key(g) == key), None)
            if group is None:  # redelivered meanwhile: nothing left to do
                return redirect(request.app.router["dead"].url_for())
            flt = RedeliveryFilter(status="dead", sinks=(group.sink,), error=group.error)
        batch = await start(self._store, flt, created_by=BY, now=view.now)
        self._on_redeliver()
        location = request.app.router["redelivery"].url_for(id=batch.id)
        return redirect(location.with_query(started="1"))


def _cursor(record: EventRecord) -> str:
    return Cursor(record.received_at, record.id).encode()
