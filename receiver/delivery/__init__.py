"""Where deliveries are scheduled and made: the worker (:mod:`.worker`) fetches each event's job
once (:mod:`.enrich`, :mod:`.snapshots`) and runs one lane per sink (:mod:`.lanes`) at that
sink's own pace; operators steer them with lane pauses (:mod:`.pauses`) and redelivery batches
(:mod:`.redelivery`); :mod:`.attempts` is what each attempt notes for the event's timeline."""
