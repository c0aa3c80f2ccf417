"""Group commit: concurrent submits written together, each caller answered after its group's
write with its own result, a failure failing only its group."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from receiver.store.batching import GroupCommit


async def test_concurrent_submits_form_one_group_and_each_gets_its_result() -> None:
    groups: list[list[int]] = []

    async def write(items: list[int]) -> Sequence[int | BaseException]:
        groups.append(items)
        return [ValueError(i) if i == 3 else i * 10 for i in items]

    commit: GroupCommit[int, int] = GroupCommit(write, max_batch=100)
    results = await asyncio.gather(*(commit.submit(i) for i in range(6)), return_exceptions=True)
    assert groups == [[0, 1, 2, 3, 4, 5]]
    assert results[:3] + results[4:] == [0, 10, 20, 40, 50]
    assert isinstance(results[3], ValueError)
    assert commit.groups == 1


async def test_submits_during_a_write_gather_into_the_next_group() -> None:
    groups: list[list[int]] = []
    release = asyncio.Event()

    async def write(items: list[int]) -> Sequence[int]:
        groups.append(items)
        await release.wait()
        return items

    commit: GroupCommit[int, int] = GroupCommit(write, max_batch=100)
    first = [commit.submit(i) for i in range(2)]
    await asyncio.sleep(0)  # the first group is being written
    later = [commit.submit(i) for i in range(2, 7)]
    release.set()
    assert await asyncio.gather(*first, *later) == list(range(7))
    assert groups == [[0, 1], [2, 3, 4, 5, 6]]
    await commit.drain()
    assert not commit.busy


async def test_max_batch_splits_groups_in_submission_order() -> None:
    groups: list[list[int]] = []

    async def write(items: list[int]) -> Sequence[int]:
        groups.append(items)
        return items

    commit: GroupCommit[int, int] = GroupCommit(write, max_batch=4)
    assert await asyncio.gather(*(commit.submit(i) for i in range(10))) == list(range(10))
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


async def test_a_failed_write_fails_its_group_only() -> None:
    calls = 0

    async def write(items: list[int]) -> Sequence[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("disk gone")
        return items

    commit: GroupCommit[int, int] = GroupCommit(write, max_batch=2)
    results = await asyncio.gather(*(commit.submit(i) for i in range(4)), return_exceptions=True)
    assert [type(r) for r in results[:2]] == [OSError, OSError]
    assert results[2:] == [2, 3]


async def test_a_cancelled_caller_is_skipped_when_its_group_is_answered() -> None:
    release = asyncio.Event()

    async def write(items: list[int]) -> Sequence[int]:
        await release.wait()
        return items

    commit: GroupCommit[int, int] = GroupCommit(write, max_batch=10)
    doomed = commit.submit(1)
    kept = commit.submit(2)
    await asyncio.sleep(0)
    doomed.cancel()
    release.set()
    assert await kept == 2
    with pytest.raises(asyncio.CancelledError):
        await doomed
