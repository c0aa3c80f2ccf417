"""What the two SQL backends share: the flow around each query, written once.

:mod:`.lanes`, :mod:`.browse` and :mod:`.pull` are the store's methods for SQLite and Postgres
alike; each runs its statements through a :class:`~.conn.Conn` (the backend's connection, with
``:name`` parameters) and takes them from the backend's statements: a class of this package
(``LaneSql``, ``BrowseSql``, ...) subclassed in ``sqlite/<concern>.py`` and
``postgres/<concern>.py``. A statement whose text is the same in both dialects is written here
once, as the class's value: a backend's module holds only the SQL that differs, so comparing
the two backends is comparing their queries.
"""
