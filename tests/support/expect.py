"""What the contract makes the receiver deliver for a simulator's payload, whatever its shape.

The simulator varies optional fields (``receiver.simulator.shape``), so a test cannot assume
that a webhook names its ``asset_ids`` or that a job has ``urls``. These helpers read the same
views the receiver is shown (the payload, ``job_json``, ``asset_json``) and apply the contract's
rules ("Processing an event", "Sinks": the download path): the assets the event names, else the
job's ``urls`` (named after the job), else nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from receiver.simulator import Simulator
from receiver.sinks.download import UNKNOWN_COLLECTION, UNNAMED_ITEM, safe_component


def job_asset_ids(sim: Simulator, payload: Mapping[str, Any]) -> dict[str, str]:
    """Every asset the job made (type -> id), whatever the payload names."""
    return dict(sim.jobs[payload["job_id"]].asset_ids)


def expected_files(sim: Simulator, payloads: Iterable[Mapping[str, Any]]) -> set[str]:
    """The download paths (relative to the sink's directory) the payloads lead to."""
    paths: set[str] = set()
    for payload in payloads:
        if payload.get("event") != "job.completed":
            continue
        job = sim.job_json(payload["job_id"])
        item = safe_component(job["item_name"]) if job.get("item_name") else UNNAMED_ITEM
        named = payload.get("asset_ids") or {}
        if named:
            for asset_type, asset_id in named.items():
                asset = sim.asset_json(asset_id)
                collection = (
                    asset.get("collection_id")
                    or job.get("collection_id")
                    or payload.get("collection_id")
                )
                collection = safe_component(collection) if collection else UNKNOWN_COLLECTION
                ext = sim.assets[asset_id].ext
                paths.add(f"{collection}/{item}/{asset.get('type') or asset_type}-{asset_id}{ext}")
        else:
            collection = job.get("collection_id")
            collection = safe_component(collection) if collection else UNKNOWN_COLLECTION
            own = sim.jobs[payload["job_id"]].asset_ids
            for asset_type in job.get("urls") or {}:
                ext = sim.assets[own[asset_type]].ext
                paths.add(f"{collection}/{item}/{asset_type}-{payload['job_id']}{ext}")
    return paths
