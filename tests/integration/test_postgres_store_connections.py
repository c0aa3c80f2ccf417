"""What only the Postgres store has to get right: its connections. A pooled connection still
busy or dropped under a statement, a database that is unreachable or hangs, a url that is not
usable, and a released connection that costs no reset.

The shared semantics are in the store contract (test_store_contract_*.py). Here several
store instances stand in for several replicas (each has its own pool of real connections), and
dropped connections are real ``pg_terminate_backend`` calls or a proxy whose port is closed.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from receiver.errors import StoreUnavailable
from receiver.store import Outcome
from receiver.store.lanes_model import LanePolicy
from receiver.store.postgres import PostgresStore
from tests.support.helpers import free_port, wait_for
from tests.support.postgres import (
    POSTGRES_URL,
    TcpProxy,
    store_settings,
    terminate_backends,
    url_with,
)
from tests.support.postgres_stores import LEASE, T0, StoreFactory, new_event, schema, stores

__all__ = ["schema", "stores"]  # fixtures, used by name


# -- dropped connections and an unreachable database --------------------------------------------


async def test_a_pooled_connection_still_busy_is_closed_and_the_call_runs_on_another(
    schema: str,
) -> None:
    """A connection back in the pool while an operation on it has not ended (as when the server
    ended it and the driver has read why but not yet the end of the stream) makes the driver
    refuse to start anything on it. The store closes that one and runs the call on another,
    rather than failing the call, or the next ones, with it."""
    store = PostgresStore(store_settings(schema))
    await store.open()
    try:
        assert store._pool is not None
        conn = await store._pool.acquire()
        busy = asyncio.create_task(conn.fetchval("SELECT pg_sleep(30)"))
        await asyncio.sleep(0.1)
        await store._pool.release(conn)  # the pool hands it out next
        assert await store.add_event(new_event("ev-1")) is True
        await store.settle("ev-1", "alpha", Outcome("done"), now=T0 + 1)
        record = await store.get("ev-1")
        assert record is not None
        assert {d.sink: d.state for d in record.deliveries}["alpha"] == "done"
        # The busy connection was closed under its statement, not left to finish it.
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            await asyncio.wait_for(busy, 10)
    finally:
        await store.close()


async def test_a_statement_cut_off_by_a_dropped_connection_is_store_unavailable(
    schema: str,
) -> None:
    name = "receiver-drop-" + schema[-8:]
    store = PostgresStore(store_settings(schema, url=url_with(application_name=name)))
    await store.open()
    holder = await asyncpg.connect(POSTGRES_URL, server_settings={"search_path": schema})
    try:
        await store.add_event(new_event("ev-1"))
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM events WHERE id = 'ev-1' FOR UPDATE")
            # The settle waits for the row lock when its connection is killed under it.
            settle = asyncio.create_task(store.settle("ev-1", "alpha", Outcome("done"), now=T0 + 1))

            async def waiting() -> bool:
                rows = await holder.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    name,
                )
                return bool(rows)

            await wait_for(waiting, what="the settle to wait for the lock")
            assert await terminate_backends(name) >= 1
            with pytest.raises(StoreUnavailable, match="Postgres inbox"):
                await settle

        # The pool replaces the dead connection: the next calls just work.
        await store.settle("ev-1", "alpha", Outcome("done"), now=T0 + 2)
        assert await store.add_event(new_event("ev-2")) is True
        record = await store.get("ev-1")
        assert record is not None
        assert {d.sink: d.state for d in record.deliveries} == {
            "alpha": "done",
            "beta": "pending",
        }
    finally:
        await holder.close()
        await store.close()


async def test_an_unreachable_database_is_store_unavailable_until_it_returns(
    schema: str,
) -> None:
    proxy = TcpProxy()
    await proxy.start()
    store = PostgresStore(store_settings(schema, url=proxy.url(), timeout_seconds=2.0))
    await store.open()
    try:
        assert await store.add_event(new_event("before")) is True

        await proxy.stop()  # the database restarts: connections cut, the port closed
        for call in (
            store.add_event(new_event("during")),
            store.ping(),
            store.counts(),
            store.claim_enrichment(owner="w", limit=5, lease_seconds=LEASE, now=T0),
            store.claim_deliveries(
                LanePolicy("alpha"), owner="w", limit=5, lease_seconds=LEASE, now=T0
            ),
        ):
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{proxy.port}"):
                await call

        await proxy.start()

        async def healed() -> bool:
            try:
                return await store.add_event(new_event("after")) is True
            except StoreUnavailable:
                return False

        await wait_for(healed, what="the store to reconnect")
        assert await store.get("during") is None
        assert (await store.counts())[0]["pending"] == 2
    finally:
        await store.close()
        await proxy.stop()


async def test_opening_an_unreachable_database_names_it_without_the_password() -> None:
    port = free_port()  # nothing listens here
    url = f"postgresql://postgres:s3cret-pw@127.0.0.1:{port}/test"
    store = PostgresStore(store_settings("receiver_unused", url=url))
    with pytest.raises(StoreUnavailable) as caught:
        await store.open()
    message = caught.value.message
    assert f"cannot reach the Postgres inbox postgresql://127.0.0.1:{port}/test" in message
    assert "s3cret" not in message
    with pytest.raises(StoreUnavailable, match="not open"):
        await store.add_event(new_event("ev-1"))


async def test_a_hung_database_is_store_unavailable_within_the_timeout(schema: str) -> None:
    proxy = TcpProxy()
    await proxy.start()
    store = PostgresStore(store_settings(schema, url=proxy.url(), timeout_seconds=1.0))
    await store.open()
    try:
        assert await store.add_event(new_event("before")) is True
        proxy.hold()  # connections stay open, nothing comes back
        with pytest.raises(StoreUnavailable, match="did not answer within 1 s"):
            await store.add_event(new_event("during"))
        with pytest.raises(StoreUnavailable, match="did not answer within 1 s"):
            await store.ping()
        proxy.resume()

        async def healed() -> bool:
            try:
                await store.add_event(new_event("after"))
            except StoreUnavailable:
                return False
            return True

        await wait_for(healed, what="the store to answer again")
        record = await store.get("after")
        assert record is not None
    finally:
        await store.close()
        await proxy.stop()


@pytest.mark.parametrize(
    "url",
    ["postgresql://127.0.0.1:port/test", "postgresql://127.0.0.1:5432/test?sslmode=sometimes"],
)
async def test_a_malformed_url_is_named_as_such(url: str) -> None:
    with pytest.raises(StoreUnavailable, match="is not a usable Postgres url"):
        await PostgresStore(store_settings("receiver_unused", url=url)).open()


async def test_a_released_connection_costs_no_reset_round_trip(stores: StoreFactory) -> None:
    store = await stores(pool_size=1)
    await store.add_event(new_event("ev-1"))
    conn = await store._pool.acquire()
    try:
        await conn.execute("SET application_name = 'probe'")
    finally:
        await store._pool.release(conn)
    # The session setting survived the release: no RESET ALL (nor any other statement) ran.
    conn = await store._pool.acquire()
    try:
        assert await conn.fetchval("SHOW application_name") == "probe"
    finally:
        await store._pool.release(conn)
