"""The Postgres inbox: one database shared by several receiver replicas (``receiver[postgres]``).

Semantics are the SQLite store's (see :mod:`receiver.store.base`); what changes is that several
processes write at once:

- A duplicate event id is settled by the primary key (``INSERT ... ON CONFLICT DO NOTHING``):
  two replicas storing the same event at the same moment both succeed, one row exists, and
  exactly one of them is told the event is new.
- Claims lock candidate rows with ``FOR UPDATE SKIP LOCKED``, so replicas never wait for each
  other nor take the same event or delivery; a lease still bounds how long a claim lives.
- A lane's claim first locks that sink's row in ``lanes`` (``FOR UPDATE``): its tokens, pause
  and circuit are read and written in the claim's transaction, so replicas together keep to
  the sink's rate. Other lanes' claims never wait for it.
- Each new event, and each event whose job was fetched, sends ``NOTIFY receiver_new_events``
  (payload: the schema); :meth:`PostgresStore.on_new_events` LISTENs on a connection of its own
  and wakes idle workers at once. Polling stays the fallback while that connection is down.
- Settling, redelivering and recomputing an event lock its row first, so two deliveries of one
  event settled on two connections cannot both miss the other's result.
- Schema migrations are numbered, recorded in ``receiver_schema_migrations`` and applied under a
  transaction-scoped advisory lock: replicas starting together migrate once.

Every driver or network error becomes :class:`~receiver.errors.StoreUnavailable`. The pool
replaces broken connections on the next use, so the store heals by itself once Postgres answers
again (after a restart, a failover or a dropped connection).

This module holds the pool and LISTEN; the rest of :class:`PostgresStore` comes from
the flows the SQL backends share (:mod:`receiver.store.sql`), which run the statements of
:mod:`.lanes`, :mod:`.browse` and :mod:`.pull`, from :mod:`.intake` and from :mod:`.migrate`
(schema in :mod:`.schema`). Each module is named as its twin in the other backends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncpg

from receiver.config.settings import StoreSettings
from receiver.errors import StoreUnavailable
from receiver.logs import get_logger, redact_url
from receiver.store import rules
from receiver.store.batching import GroupCommit
from receiver.store.postgres.browse import PostgresBrowse
from receiver.store.postgres.conn import CHANNEL, PostgresConn
from receiver.store.postgres.errors import _CONFLICTS, _DB_ERRORS, refused_to_start
from receiver.store.postgres.intake import GROUP_WRITERS, MAX_GROUP, PostgresIntake
from receiver.store.postgres.lanes import PostgresLanes
from receiver.store.postgres.migrate import PostgresMigrations
from receiver.store.postgres.pull import PostgresPull
from receiver.store.postgres.schema import _quote_ident
from receiver.store.postgres.space import PostgresSpace
from receiver.store.records import NewEvent
from receiver.store.sql.browse import SqlBrowse
from receiver.store.sql.conn import Conn
from receiver.store.sql.lanes import SqlLanes
from receiver.store.sql.pull import SqlPull
from receiver.store.sql.steps import SqlSteps

T = TypeVar("T")

log = get_logger("receiver.store.postgres")

#: Statements retried at once when Postgres aborted them to break a lock cycle.
RETRIES_ON_CONFLICT = 3
LISTEN_BACKOFF_MAX_SECONDS = 30.0
LISTEN_HEALTH_SECONDS = 30.0
PING = "SELECT 1"


class PostgresStore(
    SqlLanes, SqlBrowse, SqlPull, SqlSteps, PostgresIntake, PostgresMigrations, PostgresSpace
):
    """The inbox in a Postgres database, shared safely by any number of receiver processes.

    ``settings.pool_size`` caps this process's pooled connections (a process running workers
    holds one more, for LISTEN); ``settings.timeout_seconds`` bounds connecting, waiting for a
    pooled connection and each statement; ``settings.schema`` names the schema of the tables.

    Concurrent :meth:`add_event` calls are group-committed (see :mod:`receiver.store.batching`):
    one statement and one commit for every event waiting, on at most ``GROUP_WRITERS`` pooled
    connections, so the rest of the pool stays free for workers and the admin API.
    """

    # The statements the flows written once (receiver.store.sql) run here.
    _lane_sql = PostgresLanes
    _browse_sql = PostgresBrowse
    _batch_sql = PostgresBrowse.BATCHES
    _pull_sql = PostgresPull

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self.url = settings.url
        self.where = redact_url(settings.url)
        self._timeout = settings.timeout_seconds
        self._pool: Any = None
        self._schema = settings.schema
        self._callbacks: list[Callable[[], None]] = []
        self._listener: asyncio.Task[None] | None = None
        self._listen_conn: Any = None
        self._adds: GroupCommit[NewEvent, bool] = GroupCommit(
            self._write_adds, max_batch=MAX_GROUP, max_in_flight=GROUP_WRITERS
        )

    # -- connections ----------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        server_settings = {}
        # Named in pg_stat_activity; a url's ?application_name=... (one per replica) wins.
        if "application_name" not in parse_qs(urlsplit(self.url).query):
            server_settings["application_name"] = "receiver"
        if self.settings.schema:
            server_settings["search_path"] = _quote_ident(self.settings.schema)
        return {
            "dsn": self.url,
            "timeout": self._timeout,
            "command_timeout": self._timeout,
            "server_settings": server_settings,
        }

    async def _connect(self) -> Any:
        return await asyncpg.connect(**self._connect_kwargs())

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        """A short, driver-free message naming the database (never its password)."""
        if isinstance(exc, TimeoutError):
            message = f"the Postgres inbox {self.where} did not answer within {self._timeout:g} s"
        elif isinstance(exc, ConnectionRefusedError):
            message = f"cannot reach the Postgres inbox {self.where}: connection refused"
        elif isinstance(exc, OSError):
            reason = exc.strerror or str(exc) or type(exc).__name__
            message = f"cannot reach the Postgres inbox {self.where}: {reason}"
        elif isinstance(exc, asyncpg.PostgresError):
            message = f"the Postgres inbox {self.where} failed: {exc}"
        else:
            message = f"the connection to the Postgres inbox {self.where} failed: {exc}"
        err = StoreUnavailable(message)
        err.__cause__ = exc
        return err

    def _bad_url(self, exc: ValueError) -> StoreUnavailable:
        return StoreUnavailable(f"store.url {self.where} is not a usable Postgres url: {exc}")

    # -- lifecycle ------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            conn = await self._connect()
            try:
                await self._migrate(conn, apply=self.settings.auto_migrate)
            finally:
                await self._close_conn(conn)
            self._pool = await asyncpg.create_pool(
                min_size=min(GROUP_WRITERS, self.settings.pool_size),
                max_size=self.settings.pool_size,
                # No session state is ever changed on a pooled connection (no SET, no LISTEN,
                # only transaction-scoped locks), so a release needs no reset round trip.
                reset=_keep_session,
                # Idle connections are closed after a while, so a failover is picked up.
                max_inactive_connection_lifetime=300.0,
                **self._connect_kwargs(),
            )
        except ValueError as exc:  # a malformed url or option (before any connection)
            raise self._bad_url(exc) from exc
        except _DB_ERRORS as exc:
            raise self._unavailable(exc) from exc
        if self._callbacks:
            self._start_listener()

    async def close(self) -> None:
        await self._adds.drain()  # what was submitted is still written and answered
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self._timeout)
            except _DB_ERRORS:
                pool.terminate()

    async def _close_conn(self, conn: Any) -> None:
        try:
            await asyncio.wait_for(conn.close(), self._timeout)
        except _DB_ERRORS:
            conn.terminate()

    # -- running statements ---------------------------------------------------------------------

    async def _run(
        self,
        fn: Callable[[Any], Awaitable[T]],
        *,
        transaction: bool = False,
        snapshot: bool = False,
    ) -> T:
        """Run ``fn`` on a pooled connection; map driver errors.

        ``transaction`` runs it in one read-committed transaction (writes); ``snapshot`` in one
        read-only repeatable-read transaction, so an event and its deliveries are read as of
        one moment.

        The whole call, waiting for a connection included, gets ``timeout_seconds``: a hung
        database makes intake answer 503 in time, not hang with the request.
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("the inbox is not open")
        try:
            async with asyncio.timeout(self._timeout):
                return await self._attempts(pool, fn, transaction, snapshot)
        except TimeoutError as exc:
            raise self._unavailable(exc) from exc

    async def _attempts(
        self, pool: Any, fn: Callable[[Any], Awaitable[T]], transaction: bool, snapshot: bool
    ) -> T:
        conflicts = refusals = 0
        while True:
            try:
                async with pool.acquire(timeout=self._timeout) as conn:
                    try:
                        return await _once(conn, fn, transaction, snapshot)
                    except _DB_ERRORS as exc:
                        if not refused_to_start(exc) or refusals == self.settings.pool_size:
                            raise
                        # A pooled connection busy for ever (see refused_to_start): closed
                        # now, it is never handed out again, and the call runs on another.
                        conn.terminate()
                        refusals += 1
            except _CONFLICTS as exc:
                # Postgres rolled the whole transaction back: running it again is safe.
                conflicts += 1
                if conflicts > RETRIES_ON_CONFLICT:
                    raise self._unavailable(exc) from exc
            except _DB_ERRORS as exc:
                raise self._unavailable(exc) from exc

    async def _run_read(self, fn: Callable[[Conn], Awaitable[T]], *, snapshot: bool = False) -> T:
        return await self._run(lambda conn: fn(PostgresConn(conn, self._schema)), snapshot=snapshot)

    async def _run_write(
        self, fn: Callable[[Conn], Awaitable[T]], *, transaction: bool = True, durable: bool = True
    ) -> T:
        """A flow's write; every commit here is durable (``durable`` is for SQLite's sake)."""
        return await self._run(
            lambda conn: fn(PostgresConn(conn, self._schema)), transaction=transaction
        )

    # -- the Store interface --------------------------------------------------------------------

    async def ping(self) -> None:
        async def run(conn: Any) -> None:
            await conn.fetchval(PING)

        await self._run(run)

    async def add_event(self, event: NewEvent) -> bool:
        if self._pool is None:
            raise StoreUnavailable("the inbox is not open")
        # Refused here, in the caller's task: in the group's one statement it would fail them all.
        rules.refuse_unstorable((event.id, event.event, event.job_id))
        return await self._adds.submit(event)

    # -- LISTEN/NOTIFY --------------------------------------------------------------------------

    def on_new_events(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever any process stores (or redelivers) events in this schema.

        Listens on a connection of its own, reconnecting with backoff when it drops; after each
        (re)connection the callback runs once, for whatever arrived while nobody listened.
        """
        self._callbacks.append(callback)
        if self._pool is not None:
            self._start_listener()

    def _start_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name="postgres-store-listener"
            )

    def _wake(self) -> None:
        for callback in self._callbacks:
            callback()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == self._schema:
            self._wake()

    async def _listen(self) -> None:
        delay = 0.5
        while True:
            conn = None
            try:
                conn = await self._connect()
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._notified)
                if delay > 0.5:
                    log.info("listening for new events again")
                delay = 0.5
                self._wake()
                while not conn.is_closed():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), LISTEN_HEALTH_SECONDS)
                    if not lost.is_set():
                        # A silent network can leave a dead socket open: ask something.
                        await conn.fetchval(PING)
            except _DB_ERRORS as exc:
                log.warning(
                    "not listening for new events; polling meanwhile",
                    error=self._unavailable(exc).message,
                    retry_in=delay,
                )
            finally:
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, LISTEN_BACKOFF_MAX_SECONDS)


async def _once(
    conn: Any, fn: Callable[[Any], Awaitable[T]], transaction: bool, snapshot: bool
) -> T:
    """``fn`` on ``conn``: in a read-only repeatable-read transaction (``snapshot``), in a
    read-committed one (``transaction``) or as it is."""
    if snapshot:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            return await fn(conn)
    if transaction:
        async with conn.transaction():
            return await fn(conn)
    return await fn(conn)


async def _keep_session(_conn: Any) -> None:
    """The pool's reset on release: nothing to undo (asyncpg still rolls back an open
    transaction first)."""
