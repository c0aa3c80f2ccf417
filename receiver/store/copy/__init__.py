"""Copying an inbox from one store to another: ``receiver store copy``.

SQLite to Postgres, Postgres to SQLite, and either to its own kind. The source is read inside
one snapshot (a SQLite read transaction, a Postgres ``REPEATABLE READ`` read-only transaction),
table by table in key order, in bounded batches; each batch is one transaction on the target.
At the end every table's keys on the target are compared with the source's snapshot.

- :mod:`.locations`: the ``--from``/``--to`` urls.
- :mod:`.tables`: the tables both stores hold, their keys and the order they are copied in.
- :mod:`.convert`: a value as one backend stores it, made what the other stores.
- :mod:`.sqlite_side`, :mod:`.postgres_side`: reading and writing each backend.
- :mod:`.verify`: the key comparison.
- :mod:`.run`: the whole copy.
"""
