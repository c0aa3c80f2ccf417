"""What the sinks send, below the sinks and the config that names it: the envelopes of an
enriched event (:mod:`.envelopes`: the receiver's own, CloudEvents structured and binary) and
the message templates of the chat, stream and queue sinks (:mod:`.template`)."""
