"""Where the upstream service is called: its API client (:mod:`.client`, with the pinned API
version in :mod:`.pin` and the Deprecation and Sunset headers read by :mod:`.deprecation`), its
webhook subscriptions (:mod:`.subscriptions`, ``receiver webhooks``) and the watchdog that
checks them (:mod:`.watchdog`).

What the receiver reads of the upstream is declared once (:mod:`.reads`). Every fetched job,
asset and asset page is checked on those fields (:mod:`.conformance`), and the upstream's
OpenAPI document is compared with the one this release was built against (:mod:`.spec_source`
reads both, :mod:`.openapi` and :mod:`.schema_shape` read them for their meaning,
:mod:`.drift` compares, :mod:`.spec_check` does it inside ``receiver serve`` and for ``receiver
upstream check``)."""
