"""The configuration: its sections and keys (:mod:`.settings`, :mod:`.schema`), how a TOML file
becomes :class:`~receiver.config.settings.Settings` (:mod:`.load`, with the ``[[sinks]]`` tables
in :mod:`.sinks` checked against the sink types of :mod:`.sink_types` and :mod:`.sink_checks`),
and how it is written and shown (:mod:`.render` for ``receiver init``, :mod:`.shown` for
``check-config``, :mod:`.reference` for docs/configuration.md)."""
