"""Where operators act: the ops listener's health, readiness, metrics and admin API
(:mod:`.handlers`) and the admin API for an incident, redelivery batches and lane pauses
(:mod:`.incident`). The inbox page is :mod:`receiver.web`."""
