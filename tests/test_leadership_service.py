"""``pipeline.leadership.LeadershipService`` on a real SQLite metadata file: membership's end.

A clean stop ends the broker's lease (``unregister``); the heartbeat the database then refuses is
the stop's own doing, not a fence: the broker must not end with the fenced status (3) then, which
its supervisor (or a host's service manager) would take for a crash. A lease that runs out while
the broker still serves is a fence.
"""

from __future__ import annotations

import trio

from pipeline.cluster import DynamicCluster
from pipeline.leadership import LeadershipService
from pipeline.log.manager import LogManager

ENDPOINT = (("PLAINTEXT", "127.0.0.1", 9092),)


def _service(tmp_path, fenced: list[str]) -> LeadershipService:
    return LeadershipService(DynamicCluster(0, "127.0.0.1", 9092), tmp_path / "cluster.db", ENDPOINT,
                             session_ms=1000, heartbeat_ms=50, logs=LogManager(), end_offsets=lambda topics: {}, topics=dict,
                             on_fenced=lambda: fenced.append("fenced"))


async def _until_registered(service: LeadershipService) -> None:
    with trio.fail_after(30):
        while not service.cluster.member:
            await trio.sleep(0.02)


def test_a_clean_stop_ends_the_lease_without_fencing_the_broker(tmp_path):
    fenced: list[str] = []
    service = _service(tmp_path, fenced)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await _until_registered(service)
            await service.unregister()
            await trio.sleep(0.5)  # ten heartbeats, each refused: the lease is over
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert fenced == []
    assert not service.cluster.member


def test_a_lease_ended_by_someone_else_fences_the_broker(tmp_path):
    fenced: list[str] = []
    service = _service(tmp_path, fenced)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await _until_registered(service)
            assert service.store is not None and service.epoch is not None
            # As the lease running out while the broker was stalled: the database ends it, not the broker.
            await trio.to_thread.run_sync(service.store.registry.unregister, 0, service.epoch)
            with trio.fail_after(30):
                while not fenced:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert fenced == ["fenced"]
