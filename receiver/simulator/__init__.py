"""A local stand-in for the upstream service, for the tests and ``receiver simulate``.

:class:`Simulator` holds jobs, assets and webhook subscriptions in memory and serves them with
the upstream's envelopes (``{"data": ...}`` / ``{"error": {"code", "message"}}``)::

    GET    /v1/jobs/{id}[?wait=true&timeout=N]   the job (long-poll until completed/failed)
    GET    /v1/assets/{id}                       the asset with a fresh signed file_url
    POST   /v1/webhooks                          create (the secret is shown once)
    GET    /v1/webhooks                          list (without secrets)
    DELETE /v1/webhooks/{id}                     204
    GET    /files/{asset_id}{ext}?expires=&sig=  the bytes, like a CDN (403 bad/expired signature)
    GET    /v1/openapi.json                      the OpenAPI document (no key needed)

Every other ``/v1`` call needs ``Authorization: Bearer <api_key>``. Faults are plain
attributes a test may change at any time (``rate_limit_fraction``, ``error_fraction``,
``latency_seconds`` ...); the clock (``now``) is injectable and the randomness seeded, so runs
are reproducible.

The modules:

- :mod:`~receiver.simulator.model`: job kinds, jobs, assets and subscriptions as plain data;
- :mod:`~receiver.simulator.media`: the placeholder PNG, MP4/MOV and WebM files;
- :mod:`~receiver.simulator.state`: the state: jobs, assets, subscriptions, how they are made;
- :mod:`~receiver.simulator.views`: what the API shows of that state now;
- :mod:`~receiver.simulator.shape`: which optional fields each object shows (``--shape``);
- :mod:`~receiver.simulator.versions`: the API versions accepted, the OpenAPI document and its
  drift, Deprecation/Sunset on the job endpoint, job statuses outside the spec;
- :mod:`~receiver.simulator.api`: :class:`Simulator`, that state served over HTTP;
- :mod:`~receiver.simulator.delivery` and :mod:`~receiver.simulator.sender`: signed webhook
  deliveries with the upstream's retries;
- :mod:`~receiver.simulator.run`: ``receiver simulate`` as one process, events and faults;
- :mod:`~receiver.simulator.cli`: the flags of ``receiver simulate``;
- :mod:`~receiver.simulator.demo`: ``make demo``, the simulator and a receiver together.
"""

from receiver.simulator.api import SIMULATOR_KEY, Simulator
from receiver.simulator.media import png_bytes
from receiver.simulator.model import DEFAULT_API_KEY, DERIVED_TYPES, KINDS, SimWebhook

__all__ = [
    "DEFAULT_API_KEY",
    "DERIVED_TYPES",
    "KINDS",
    "SIMULATOR_KEY",
    "SimWebhook",
    "Simulator",
    "png_bytes",
]
