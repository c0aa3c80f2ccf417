"""The in-memory inbox: :class:`MemoryStore` (:mod:`.store`), the fake for tests, with the SQL
stores' semantics; its parts named as their twins in the other backends."""

from receiver.store.memory.store import MemoryStore

__all__ = ["MemoryStore"]
