"""Where a webhook comes in: the public endpoint (:mod:`.endpoint`: size-capped read, signature,
validation, durable store, then the 2xx), its listener (:mod:`.listener`), the extra intake
processes of ``--processes N`` (:mod:`.processes`) and the endpoint with tracing on
(:mod:`.tracing`)."""
