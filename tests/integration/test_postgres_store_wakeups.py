"""What only the Postgres store has to get right: waking idle replicas when there is new work
(LISTEN/NOTIFY), only those of the same schema, and again once the listening connection is
killed (a real ``pg_terminate_backend``).

The shared semantics are in the store contract (test_store_contract_*.py). Here several
store instances stand in for several replicas (each has its own pool of real connections).
"""

from __future__ import annotations

from receiver.store import Outcome
from receiver.store.postgres import PostgresStore
from tests.support.helpers import wait_for
from tests.support.postgres import (
    fresh_schema,
    require_postgres,
    store_settings,
    terminate_backends,
    url_with,
)
from tests.support.postgres_stores import T0, StoreFactory, new_event, schema, stores
from tests.support.store_cases import redeliver

__all__ = ["schema", "stores"]  # fixtures, used by name


# -- waking idle workers ------------------------------------------------------------------------


class Wakes:
    """Counts callback calls; ``await wakes.reach(n)`` waits for the n-th."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1

    async def reach(self, n: int) -> None:
        async def reached() -> bool:
            return self.count >= n

        await wait_for(reached, what=f"{n} wake-ups")


async def test_new_events_wake_other_replicas_of_the_same_schema_only(
    stores: StoreFactory,
) -> None:
    writer, idle = await stores(), await stores()
    require_postgres()
    async with fresh_schema() as other_schema:
        other = PostgresStore(store_settings(other_schema))
        await other.open()
        try:
            wakes = Wakes()
            idle.on_new_events(wakes)
            await wakes.reach(1)  # once listening: whatever arrived before is looked at

            await other.add_event(new_event("elsewhere"))  # another inbox: no wake-up
            await writer.add_event(new_event("ev-1"))
            await wakes.reach(2)
            # Notifications arrive in commit order: had the other schema's woken us, the count
            # would already be past 2.
            assert wakes.count == 2

            await writer.add_event(new_event("ev-1"))  # a duplicate adds nothing to wake for
            await writer.add_event(new_event("ev-2"))
            await wakes.reach(3)
            assert wakes.count == 3

            await writer.settle("ev-2", "alpha", Outcome("dead", error="x"), now=T0 + 1)
            await redeliver(writer, now=T0 + 2)
            await wakes.reach(4)
            await redeliver(writer, now=T0 + 3, status="any", event_id="ev-1")
            await wakes.reach(5)
        finally:
            await other.close()


async def test_the_listener_comes_back_after_its_connection_is_killed(schema: str) -> None:
    name = "receiver-listen-" + schema[-8:]
    idle = PostgresStore(store_settings(schema, url=url_with(application_name=name)))
    writer = PostgresStore(store_settings(schema))
    await idle.open()
    await writer.open()
    try:
        wakes = Wakes()
        idle.on_new_events(wakes)
        await wakes.reach(1)
        assert await terminate_backends(name) >= 1

        await wakes.reach(2)  # reconnected (and looks once for what it may have missed)
        await writer.add_event(new_event("ev-1"))
        await wakes.reach(3)
    finally:
        await idle.close()
        await writer.close()
