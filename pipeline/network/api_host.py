"""What an api package needs of the object that serves the api keys (``pipeline.requests.handler.KafkaApis``).

Fetch (``pipeline.log.fetch``), the group coordinator (``pipeline.coordinator.service``), and the
ACL and SASL apis register their api keys with KafkaApis and ask it to authorize; Kafka's
``KafkaApis`` plays the same role. They sit in layers below ``requests``, so they name this
Protocol instead of the class (a renamed method then fails the type check, where ``Any`` hid it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from pipeline.network.request_channel import Request
from pipeline.network.request_metrics import RequestMetrics
from pipeline.protocol.apis import BrokerInfo
from pipeline.security.acl import AclOperation, ResourceType

__all__ = ("ApiHandler", "ApiHost", "PartitionCounts")

ApiHandler = Callable[[Request], Awaitable[None]]
"""Serves one api: completes the request on its connection, now or later (``ApiHost.register``)."""


class PartitionCounts(Protocol):
    """The topics a broker knows, as the api packages ask (``pipeline.requests.catalog.TopicCatalog``)."""

    def partitions(self, name: str) -> int | None:
        """``name``'s partition count, None if there is no such topic."""


class ApiHost(Protocol):
    """The api-serving side of a broker (``KafkaApis``): its identity, its topics, its request
    metrics, the api keys it serves and its authorizer."""

    @property
    def broker(self) -> BrokerInfo:
        """This broker as Metadata advertises it, with its cluster's leaders."""

    @property
    def catalog(self) -> PartitionCounts:
        """The topics this broker knows."""

    @property
    def request_metrics(self) -> RequestMetrics:
        """Where an api counts its responses' error codes."""

    def register(self, api_key: int, handler: ApiHandler) -> None:
        """Serve ``api_key`` with ``handler``."""

    def authorize(self, request: Request, operation: AclOperation, resource_type: ResourceType, name: str,
                  log_denied: bool = True) -> bool:
        """May the request's principal do ``operation`` on resource ``name`` (Kafka's ``Authorizer``)?"""
