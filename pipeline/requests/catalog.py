"""The broker's topics: auto-created on first use, each with a partition count.

Kafka creates a topic on a Metadata request naming it when
``auto.create.topics.enable`` is on (the default) and the client allows it
(MetadataRequest.allow_auto_topic_creation, v4+), with ``num.partitions``
partitions. Produce to a topic that does not exist is answered with
UNKNOWN_TOPIC_OR_PARTITION (clients ask Metadata first).
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from pipeline.protocol.apis import validate_topic_name

log = logging.getLogger(__name__)


class TopicCatalog:
    """Topic name -> partition count. Satisfies ``pipeline.protocol.apis.TopicResolver``.

    Args:
        num_partitions: partitions of an auto-created topic (Kafka ``num.partitions``).
        auto_create: Kafka ``auto.create.topics.enable``.
        initial: topics known at start (e.g. recovered from the table).
    """

    def __init__(self, num_partitions: int = 1, auto_create: bool = True,
                 initial: dict[str, int] | None = None) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        self.num_partitions = num_partitions
        self.auto_create = auto_create
        self._topics: dict[str, int] = dict(initial or {})

    def partitions(self, name: str) -> int | None:
        """Partition count of ``name``, or None if no such topic."""
        return self._topics.get(name)

    def describe(self, name: str, auto_create: bool) -> tuple[int, int]:
        """(error code, partition count) for a Metadata request naming ``name``."""
        count = self._topics.get(name)
        if count is not None:
            return ErrorCode.none.value, count
        try:
            validate_topic_name(name)
        except ValueError:
            return ErrorCode.invalid_topic_exception.value, 0
        if not (auto_create and self.auto_create):
            return ErrorCode.unknown_topic_or_partition.value, 0
        self._topics[name] = self.num_partitions
        log.info("auto-created topic %r with %d partitions", name, self.num_partitions)
        return ErrorCode.none.value, self.num_partitions

    def all_topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        return dict(self._topics)
