"""The admin apis: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
IncrementalAlterConfigs and DescribeCluster, as one broker that is also the controller.

Each handler decodes its request, decides per topic/resource what Kafka's
controller would (the rules and messages of ``ReplicationControlManager``,
``ConfigAdminManager``, ``ControllerApis`` and ``KafkaApis``, cited per
method), changes the ``TopicCatalog`` (whose SQLite writes run in a worker
thread) and completes the request once everything is done: a deleted topic's
data is gone before DeleteTopics answers. Requests' ``timeout_ms`` are not
used to answer early.

Results are built with kio's classes for the request's version
(``apis.response_module``); ``apis.make`` drops the fields a version lacks.

Authorization (issue 9) goes through ``KafkaApis.authorize`` (allowed when no
authorizer is configured), per topic or resource as Kafka's ``ControllerApis``
and ``KafkaApis`` check it; each method cites its rule.
"""

from __future__ import annotations

import collections
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from kio.schema.errors import ErrorCode

from pipeline.admin.topic_configs import (AlterOp, ConfigEntry, ConfigSource, ConfigType, InvalidConfigError, Synonym,
                                          TopicConfigs)
from pipeline.network.api_host import ApiHost
from pipeline.protocol import apis
from pipeline.protocol.apis import BrokerInfo, validate_topic_name
from pipeline.requests.catalog import NoSuchTopicError, TopicCatalog, TopicExistsError
from pipeline.network.request_channel import Request
from pipeline.network.request_metrics import RequestMetrics, add_error
from pipeline.security.acl import CLUSTER_NAME, AclOperation, ResourceType

if TYPE_CHECKING:
    from pipeline.config import ServerConfig

log = logging.getLogger(__name__)

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS = apis.CREATE_TOPICS, apis.DELETE_TOPICS, apis.DESCRIBE_CONFIGS
CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CLUSTER = (
    apis.CREATE_PARTITIONS, apis.INCREMENTAL_ALTER_CONFIGS, apis.DESCRIBE_CLUSTER)

TOPIC_RESOURCE, BROKER_RESOURCE, BROKER_LOGGER_RESOURCE = 2, 4, 8
"""Kafka ``ConfigResource.Type`` codes."""

MAX_PARTITIONS = 10_000
"""Most partitions a topic may have (ours, not Kafka's): every Metadata response lists them all."""

_ZERO_UUID = uuid.UUID(int=0)
_NO_AUTHORIZED_OPERATIONS = -2147483648
"""Kafka's "not requested" value for authorized operations (Integer.MIN_VALUE)."""
# Kafka AclOperation codes of the operations a CLUSTER resource supports
# (AclEntry.supportedOperations: CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9,
# DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12) as a bit field;
# with no authorizer every one is allowed (KafkaApis.handleDescribeCluster, KIP-430).
_CLUSTER_OPERATION_CODES = (5, 7, 8, 9, 10, 11, 12)
_CLUSTER_OPERATIONS = sum(1 << op for op in _CLUSTER_OPERATION_CODES)
_AUTHORIZATION_FAILED = "Authorization failed."
"""Kafka's message for TOPIC_AUTHORIZATION_FAILED results of the admin apis."""

DeleteHook = Callable[[str], Awaitable[None]]
"""``on_delete_topic(topic)``: remove everything the topic stored (see ``AdminApis``)."""


class _Refused(Exception):
    """One topic's or resource's error: a Kafka error code and message."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """One broker config DescribeConfigs lists: from ``pipeline.config.KEYS``."""

    name: str
    value: str | None
    source: ConfigSource
    config_type: ConfigType
    documentation: str


def broker_configs(server: ServerConfig) -> list[BrokerConfig]:
    """The broker's configs from ``ServerConfig`` ``server``, one per ``pipeline.config.KEYS``
    entry (but ``log.level``/``log.format``, which live in the logging setup): STATIC_BROKER_CONFIG
    when the value differs from the default (set by the file, the environment or a flag),
    DEFAULT_CONFIG otherwise (Kafka ``KafkaConfig`` sources, KIP-226)."""
    from pipeline.config import KEYS, default_value, server_value

    out = []
    for name, key in KEYS.items():
        if key.fields[0].startswith("log."):  # log.level, log.format: the logging set-up's, not ServerConfig's
            continue
        values = tuple(server_value(server, f) for f in key.fields)
        value = values if len(values) > 1 and any(v is not None for v in values) else values[0]
        source = ConfigSource.DEFAULT_CONFIG if value == default_value(key) else ConfigSource.STATIC_BROKER_CONFIG
        shown = key.show(value)
        default = default_value(key)
        if isinstance(default, bool):
            config_type = ConfigType.BOOLEAN
        elif isinstance(default, int):
            config_type = ConfigType.LONG if name.endswith((".ms", ".bytes")) else ConfigType.INT
        elif isinstance(default, float):
            config_type = ConfigType.DOUBLE
        else:
            config_type = ConfigType.STRING
        text = None if shown is None else (str(shown).lower() if isinstance(shown, bool) else str(shown))
        out.append(BrokerConfig(name, text, source, config_type, key.help))
    return out


class AdminApis:
    """Serves the admin apis for one broker (``register`` them on ``KafkaApis``).

    Args:
        broker: this broker (node id, address, cluster id); it is the controller too.
        catalog: the topics (with a ``TopicStore`` in a server).
        configs: the topic config rules and defaults.
        on_delete_topic: awaited for each topic DeleteTopics deletes, after the
            topic stopped taking produce requests and before it is forgotten in
            the store: it must make the topic's data gone (buffered records
            written, partition logs dropped, table rows dropped). If it raises,
            that topic's result is UNKNOWN_SERVER_ERROR and the topic stays.
        broker_configs: what DescribeConfigs says of BROKER resources (``broker_configs``).
        request_metrics: where each result's error code is counted.
    """

    def __init__(self, broker: BrokerInfo, catalog: TopicCatalog, configs: TopicConfigs,
                 on_delete_topic: DeleteHook, broker_configs: list[BrokerConfig] | None = None,
                 request_metrics: RequestMetrics | None = None) -> None:
        self.broker = broker
        self.catalog = catalog
        self.configs = configs
        self.on_delete_topic = on_delete_topic
        self.broker_configs = {c.name: c for c in broker_configs or []}
        self.request_metrics = request_metrics if request_metrics is not None else RequestMetrics()
        self._authorize: Callable[..., bool] = lambda request, operation, resource_type, name, log_denied=True: True
        """``KafkaApis.authorize`` once registered; everything allowed before (tests without an authorizer)."""

    def register(self, kafka_apis: ApiHost) -> None:
        """Serve the six admin api keys on ``kafka_apis`` (``KafkaApis.register``); authorize with it."""
        self._authorize = kafka_apis.authorize
        kafka_apis.register(CREATE_TOPICS, self.create_topics)
        kafka_apis.register(DELETE_TOPICS, self.delete_topics)
        kafka_apis.register(CREATE_PARTITIONS, self.create_partitions)
        kafka_apis.register(DESCRIBE_CONFIGS, self.describe_configs)
        kafka_apis.register(INCREMENTAL_ALTER_CONFIGS, self.incremental_alter_configs)
        kafka_apis.register(DESCRIBE_CLUSTER, self.describe_cluster)

    def _complete(self, request: Request, body: Any, codes: list[ErrorCode]) -> None:
        errors = self.request_metrics.errors(request.header.api_key)
        for code in codes:
            add_error(errors, int(code))
        request.connection.complete(request.token, apis.encode(request.header, body))

    # -- CreateTopics ------------------------------------------------------------------

    async def create_topics(self, request: Request) -> None:
        """CreateTopics v2-v7 (Kafka ``ControllerApis.createTopics``,
        ``ReplicationControlManager.createTopic``).

        Per topic: a name twice in the request -> INVALID_REQUEST; an illegal
        name -> INVALID_TOPIC_EXCEPTION; existing -> TOPIC_ALREADY_EXISTS;
        num_partitions -1 is ``num.partitions``, below 1 (or above
        ``MAX_PARTITIONS``) INVALID_PARTITIONS; replication factor -1 or 1,
        else INVALID_REPLICATION_FACTOR; manual assignments (with
        num_partitions and replication_factor -1, else INVALID_REQUEST) must
        place partitions 0..n-1 on this broker alone, else
        INVALID_REPLICA_ASSIGNMENT; configs: ``TopicConfigs.validate``, else
        INVALID_CONFIG. ``validate_only`` checks without creating. v5+ results
        carry the partition count, replication factor and every config with
        its source (KIP-525); v7 the topic id (KIP-516).

        Authorization (Kafka ``ControllerApis.createTopics``): CLUSTER Create, or
        else TOPIC Create on the name, else TOPIC_AUTHORIZATION_FAILED (after the
        duplicate check); the v5+ configs need TOPIC DescribeConfigs, else
        ``topic_config_error_code`` is TOPIC_AUTHORIZATION_FAILED and none are given.

        Raises:
            InvalidRequestError: the body cannot be parsed.
        """
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(CREATE_TOPICS, header.api_version)
        counts = collections.Counter(t.name for t in body.topics)
        duplicates = sorted(n for n, c in counts.items() if c > 1)
        cluster_create = self._authorize(request, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME,
                                         log_denied=False)
        results, codes = [], []
        for topic in body.topics:
            values: dict[str, Any] = {"name": topic.name, "topic_id": _ZERO_UUID, "error_message": None,
                                      "num_partitions": -1, "replication_factor": -1, "configs": None,
                                      "topic_config_error_code": 0}
            try:
                if topic.name in duplicates:
                    raise _Refused(ErrorCode.invalid_request,
                                   f"Create topics request from client `{header.client_id}` contains multiple "
                                   f"entries for the following topics: {', '.join(duplicates)}")
                if not cluster_create and not self._authorize(request, AclOperation.CREATE, ResourceType.TOPIC,
                                                              topic.name):
                    raise _Refused(ErrorCode.topic_authorization_failed, _AUTHORIZATION_FAILED)
                partitions, overrides = self._check_new_topic(topic)
                if body.validate_only:
                    topic_id = apis.topic_id_for(topic.name)
                else:
                    try:
                        topic_id = (await self.catalog.create(topic.name, partitions, overrides)).topic_id
                    except TopicExistsError as exc:
                        raise _Refused(ErrorCode.topic_already_exists, str(exc)) from None
                values.update(topic_id=topic_id, num_partitions=partitions, replication_factor=1)
                if header.api_version >= 5 and not self._authorize(
                        request, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, topic.name, log_denied=False):
                    values["topic_config_error_code"] = ErrorCode.topic_authorization_failed.value
                elif header.api_version >= 5:  # KIP-525: the created topic's configs
                    values["configs"] = tuple(
                        apis.make(module.CreatableTopicConfigs, name=e.name, value=e.value, read_only=e.read_only,
                                  config_source=int(e.source), is_sensitive=False)
                        for e in self.configs.describe(topic.name, overrides))
                error = ErrorCode.none
            except _Refused as exc:
                error = exc.error
                values["error_message"] = exc.message
            values["error_code"] = error
            codes.append(error)
            results.append(apis.make(module.CreatableTopicResult, **values))
        self._complete(request, apis.make(module.CreateTopicsResponse, throttle_time=apis.ZERO_MS,
                                          topics=tuple(results)), codes)

    def _check_new_topic(self, topic: Any) -> tuple[int, dict[str, str]]:
        """(partitions, normalised configs) of a CreatableTopic. :raises _Refused: see create_topics."""
        try:
            validate_topic_name(topic.name)
        except ValueError as exc:
            raise _Refused(ErrorCode.invalid_topic_exception, str(exc)) from None
        if self.catalog.topic(topic.name) is not None or self.catalog.busy(topic.name):
            raise _Refused(ErrorCode.topic_already_exists, f"Topic '{topic.name}' already exists.")
        if topic.assignments:
            if topic.num_partitions != -1 or topic.replication_factor != -1:
                raise _Refused(ErrorCode.invalid_request,
                               "Both numPartitions or replicationFactor and replicasAssignments were set. "
                               "Both cannot be used at the same time.")
            indices = sorted(a.partition_index for a in topic.assignments)
            if indices != list(range(len(indices))):
                raise _Refused(ErrorCode.invalid_replica_assignment,
                               "partitions should be a consecutive 0-based integer sequence")
            for a in topic.assignments:
                self._check_replicas(tuple(a.broker_ids))
            partitions = len(indices)
        else:
            partitions = self.catalog.num_partitions if topic.num_partitions == -1 else topic.num_partitions
            if partitions < 1:
                raise _Refused(ErrorCode.invalid_partitions,
                               "Number of partitions was set to an invalid non-positive value.")
            factor = topic.replication_factor
            if factor == 0 or factor < -1:
                raise _Refused(ErrorCode.invalid_replication_factor,
                               "Replication factor must be larger than 0, or -1 to use the default value.")
            if factor > 1:
                raise _Refused(ErrorCode.invalid_replication_factor,
                               f"Unable to replicate the partition {factor} time(s): The target replication "
                               f"factor of {factor} cannot be reached because only 1 broker(s) are registered.")
        if partitions > MAX_PARTITIONS:
            raise _Refused(ErrorCode.invalid_partitions,
                           f"Number of partitions {partitions} is above this broker's limit of {MAX_PARTITIONS}.")
        try:
            overrides = self.configs.validate((c.name, c.value) for c in topic.configs)
        except InvalidConfigError as exc:
            raise _Refused(ErrorCode.invalid_config, str(exc)) from None
        return partitions, overrides

    def _check_replicas(self, broker_ids: tuple[int, ...]) -> None:
        """One partition's manual assignment must be exactly this broker (Kafka
        ``ReplicationControlManager.validateManualPartitionAssignment``)."""
        node = self.broker.node_id
        if not broker_ids:
            raise _Refused(ErrorCode.invalid_replica_assignment,
                           "The manual partition assignment includes an empty replica list.")
        for b in broker_ids:
            if b != node:
                raise _Refused(ErrorCode.invalid_replica_assignment,
                               f"The manual partition assignment includes broker {b}, but no such broker is "
                               "registered.")
        if len(broker_ids) != 1:
            raise _Refused(ErrorCode.invalid_replica_assignment,
                           "The manual partition assignment includes the broker "
                           f"{node} more than once.")

    # -- DeleteTopics ------------------------------------------------------------------

    async def delete_topics(self, request: Request) -> None:
        """DeleteTopics v1-v6 (Kafka ``ControllerApis.deleteTopics``).

        Topics by name (v1-v6) or by id (v6, KIP-516). Per topic: both or
        neither of name and id -> INVALID_REQUEST; named twice ->
        INVALID_REQUEST; unknown name -> UNKNOWN_TOPIC_OR_PARTITION, unknown
        id -> UNKNOWN_TOPIC_ID. A topic is deleted with
        ``TopicCatalog.delete``: no produce is accepted for it from the
        moment its deletion starts, ``on_delete_topic`` removes its data,
        then the store forgets it. Topics are deleted one after the other,
        and the request is answered when all are done.

        Authorization (Kafka ``ControllerApis.deleteTopics``): TOPIC Delete, else
        TOPIC_AUTHORIZATION_FAILED, checked before the topic's existence; a topic
        id whose topic the principal may not Describe stays UNKNOWN_TOPIC_ID.

        Raises:
            InvalidRequestError: the body cannot be parsed.
        """
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DELETE_TOPICS, header.api_version)
        if header.api_version >= 6:
            wanted = [(t.name, t.topic_id if t.topic_id not in (None, _ZERO_UUID) else None) for t in body.topics]
        else:
            wanted = [(name, None) for name in body.topic_names]
        names: list[str | None] = []
        for name, topic_id in wanted:
            names.append(name if topic_id is None else (self.catalog.name_for_id(topic_id) or f"\0{topic_id}"))
        counts = collections.Counter(names)
        results, codes = [], []
        for (name, topic_id), resolved in zip(wanted, names):
            error, message = ErrorCode.none, None
            try:
                if (name is None) == (topic_id is None) or resolved is None:  # resolved is None: both are
                    raise _Refused(ErrorCode.invalid_request, "You must specify exactly one of topic name or topic id.")
                if counts[resolved] > 1:
                    raise _Refused(ErrorCode.invalid_request, "Duplicate topic name." if topic_id is None
                                   else "Duplicate topic id.")
                if topic_id is not None and resolved.startswith("\0"):
                    raise _Refused(ErrorCode.unknown_topic_id, f"Unknown topic id {topic_id}")
                if not self._authorize(request, AclOperation.DELETE, ResourceType.TOPIC, resolved):
                    if topic_id is not None and not self._authorize(
                            request, AclOperation.DESCRIBE, ResourceType.TOPIC, resolved, log_denied=False):
                        raise _Refused(ErrorCode.unknown_topic_id, f"Unknown topic id {topic_id}")
                    raise _Refused(ErrorCode.topic_authorization_failed, _AUTHORIZATION_FAILED)
                try:
                    await self.catalog.delete(resolved, self.on_delete_topic)
                except NoSuchTopicError:
                    raise _Refused(ErrorCode.unknown_topic_or_partition,
                                   "This server does not host this topic-partition.") from None
                except Exception as exc:  # the hook failed (Spark, the file system): the topic stays
                    log.exception("deleting topic %r failed", resolved)
                    raise _Refused(ErrorCode.unknown_server_error,
                                   f"deleting the topic's data failed: {str(exc).splitlines()[0] if str(exc) else exc!r}"[:500]
                                   ) from None
            except _Refused as exc:
                error, message = exc.error, exc.message
            codes.append(error)
            results.append(apis.make(
                module.DeletableTopicResult, name=None if resolved is None or resolved.startswith("\0") else resolved,
                topic_id=topic_id or (apis.topic_id_for(resolved) if error == ErrorCode.none and resolved is not None
                                      else _ZERO_UUID),
                error_code=error, error_message=message))
        self._complete(request, apis.make(module.DeleteTopicsResponse, throttle_time=apis.ZERO_MS,
                                          responses=tuple(results)), codes)

    # -- CreatePartitions --------------------------------------------------------------

    async def create_partitions(self, request: Request) -> None:
        """CreatePartitions v0-v3 (Kafka ``ReplicationControlManager.createPartitions``).

        Per topic: named twice -> INVALID_REQUEST; unknown ->
        UNKNOWN_TOPIC_OR_PARTITION; a count not above the current one ->
        INVALID_PARTITIONS (partitions are only ever added, KIP-195); above
        ``MAX_PARTITIONS`` -> INVALID_PARTITIONS; assignments, if given, one
        per new partition, each this broker alone, else
        INVALID_REPLICA_ASSIGNMENT. ``validate_only`` checks only. New
        partitions start empty at offset 0 and show in Metadata at once.
        A topic without TOPIC Alter is TOPIC_AUTHORIZATION_FAILED, before its existence
        is checked (Kafka ``ControllerApis.createPartitions``).

        Raises:
            InvalidRequestError: the body cannot be parsed.
        """
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(CREATE_PARTITIONS, header.api_version)
        counts = collections.Counter(t.name for t in body.topics)
        results, codes = [], []
        for topic in body.topics:
            error, message = ErrorCode.none, None
            try:
                if counts[topic.name] > 1:
                    raise _Refused(ErrorCode.invalid_request, "Duplicate topic in request.")
                if not self._authorize(request, AclOperation.ALTER, ResourceType.TOPIC, topic.name):
                    raise _Refused(ErrorCode.topic_authorization_failed, _AUTHORIZATION_FAILED)
                current = self.catalog.partitions(topic.name)
                if current is None:
                    raise _Refused(ErrorCode.unknown_topic_or_partition,
                                   f"The topic '{topic.name}' does not exist.")
                if topic.count < current:
                    raise _Refused(ErrorCode.invalid_partitions,
                                   f"The topic {topic.name} currently has {current} partition(s); {topic.count} "
                                   "would not be an increase.")
                if topic.count == current:
                    raise _Refused(ErrorCode.invalid_partitions, f"Topic already has {current} partition(s).")
                if topic.count > MAX_PARTITIONS:
                    raise _Refused(ErrorCode.invalid_partitions,
                                   f"Number of partitions {topic.count} is above this broker's limit of "
                                   f"{MAX_PARTITIONS}.")
                if topic.assignments is not None:
                    if len(topic.assignments) != topic.count - current:
                        raise _Refused(ErrorCode.invalid_replica_assignment,
                                       f"Attempted to add {topic.count - current} additional partition(s), but only "
                                       f"{len(topic.assignments)} assignment(s) were specified.")
                    for a in topic.assignments:
                        self._check_replicas(tuple(a.broker_ids))
                if not body.validate_only:
                    try:
                        await self.catalog.set_partitions(topic.name, topic.count)
                    except NoSuchTopicError:
                        raise _Refused(ErrorCode.unknown_topic_or_partition,
                                       f"The topic '{topic.name}' does not exist.") from None
            except _Refused as exc:
                error, message = exc.error, exc.message
            codes.append(error)
            results.append(apis.make(module.CreatePartitionsTopicResult, name=topic.name, error_code=error,
                                     error_message=message))
        self._complete(request, apis.make(module.CreatePartitionsResponse, throttle_time=apis.ZERO_MS,
                                          results=tuple(results)), codes)

    # -- DescribeConfigs ---------------------------------------------------------------

    async def describe_configs(self, request: Request) -> None:
        """DescribeConfigs v1-v4 (Kafka ``ConfigHelper.describeConfigs``, KIP-226, KIP-569).

        TOPIC resources: every topic config ``TopicConfigs`` knows (or those
        of ``configuration_keys``), unknown topic -> UNKNOWN_TOPIC_OR_PARTITION,
        illegal name -> INVALID_TOPIC_EXCEPTION. BROKER resources named "" or
        this broker's id: every key of ``pipeline.config`` with its source,
        all read-only (none can change while the server runs); another id ->
        INVALID_REQUEST. Other resource types -> INVALID_REQUEST. Synonyms
        when ``include_synonyms``; documentation (v3+) when asked.

        Authorization (Kafka ``KafkaApis.handleDescribeConfigsRequest``): a topic
        needs TOPIC DescribeConfigs (else TOPIC_AUTHORIZATION_FAILED), a broker
        CLUSTER DescribeConfigs (else CLUSTER_AUTHORIZATION_FAILED).

        Raises:
            InvalidRequestError: the body cannot be parsed.
        """
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DESCRIBE_CONFIGS, header.api_version)
        synonyms = bool(getattr(body, "include_synonyms", False))
        documentation = bool(getattr(body, "include_documentation", False))
        results, codes = [], []
        for resource in body.resources:
            error, message, entries = ErrorCode.none, None, []
            keys = resource.configuration_keys
            try:
                self._authorize_configs(request, resource, AclOperation.DESCRIBE_CONFIGS)
                if resource.resource_type == TOPIC_RESOURCE:
                    entries = self._describe_topic(resource.resource_name, keys, synonyms)
                elif resource.resource_type == BROKER_RESOURCE:
                    self._check_broker_name(resource.resource_name)
                    entries = [ConfigEntry(c.name, c.value, c.source, True, c.config_type, c.documentation,
                                           (Synonym(c.name, c.value, c.source),) if synonyms else ())
                               for c in self.broker_configs.values() if keys is None or c.name in keys]
                else:
                    raise _Refused(ErrorCode.invalid_request,
                                   f"Unsupported resource type {resource.resource_type}: only topics (2) and "
                                   "brokers (4) have configs here")
            except _Refused as exc:
                error, message, entries = exc.error, exc.message, []
            codes.append(error)
            results.append(apis.make(
                module.DescribeConfigsResult, error_code=error, error_message=message,
                resource_type=resource.resource_type, resource_name=resource.resource_name,
                configs=tuple(apis.make(
                    module.DescribeConfigsResourceResult, name=e.name, value=e.value, read_only=e.read_only,
                    config_source=int(e.source), is_sensitive=False, config_type=int(e.config_type),
                    documentation=e.documentation if documentation else None,
                    synonyms=tuple(apis.make(module.DescribeConfigsSynonym, name=s.name, value=s.value,
                                             source=int(s.source)) for s in e.synonyms))
                    for e in entries)))
        self._complete(request, apis.make(module.DescribeConfigsResponse, throttle_time=apis.ZERO_MS,
                                          results=tuple(results)), codes)

    def _authorize_configs(self, request: Request, resource: Any, operation: AclOperation) -> None:
        """TOPIC ``operation`` for a topic, CLUSTER ``operation`` for a broker or broker logger
        (Kafka ``KafkaApis`` ``authorizeConfigsResource``); other types are left to the caller.

        Raises:
            _Refused: TOPIC_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED.
        """
        if resource.resource_type == TOPIC_RESOURCE:
            if not self._authorize(request, operation, ResourceType.TOPIC, resource.resource_name):
                raise _Refused(ErrorCode.topic_authorization_failed, _AUTHORIZATION_FAILED)
        elif resource.resource_type in (BROKER_RESOURCE, BROKER_LOGGER_RESOURCE):
            if not self._authorize(request, operation, ResourceType.CLUSTER, CLUSTER_NAME):
                raise _Refused(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")

    def _describe_topic(self, name: str, keys: Any, synonyms: bool) -> list[ConfigEntry]:
        try:
            validate_topic_name(name)
        except ValueError as exc:
            raise _Refused(ErrorCode.invalid_topic_exception, str(exc)) from None
        topic = self.catalog.topic(name)
        if topic is None:
            raise _Refused(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        return self.configs.describe(name, topic.configs, keys, synonyms)

    def _check_broker_name(self, name: str) -> None:
        """"" (the cluster default) or this broker's id (Kafka ``ConfigHelper.describeConfigs``)."""
        if name == "":
            return
        try:
            node = int(name)
        except ValueError:
            raise _Refused(ErrorCode.invalid_request, f"Broker id must be an integer, got {name!r}") from None
        if node != self.broker.node_id:
            raise _Refused(ErrorCode.invalid_request,
                           f"Unexpected broker id, expected {self.broker.node_id} or empty string, but received "
                           f"{name}")

    # -- IncrementalAlterConfigs -------------------------------------------------------

    async def incremental_alter_configs(self, request: Request) -> None:
        """IncrementalAlterConfigs v0-v1 (KIP-339; Kafka ``ConfigAdminManager``).

        TOPIC resources: SET / DELETE / APPEND / SUBTRACT applied with
        ``TopicConfigs.alter`` and stored in one change (all of a resource's
        operations or none); an unknown or read-only config or a bad value ->
        INVALID_CONFIG; an unknown operation or a config named twice ->
        INVALID_REQUEST; unknown topic -> UNKNOWN_TOPIC_OR_PARTITION.
        ``validate_only`` checks only. BROKER resources: nothing here can
        change while the server runs, so every change is refused with
        INVALID_CONFIG "Cannot update these configs dynamically" (Kafka
        ``DynamicBrokerConfig.validateConfigs`` for non-dynamic keys); a
        resource named twice -> INVALID_REQUEST; other types -> INVALID_REQUEST.

        Authorization (Kafka ``KafkaApis.handleIncrementalAlterConfigsRequest``): a
        topic needs TOPIC AlterConfigs (else TOPIC_AUTHORIZATION_FAILED), a broker
        CLUSTER AlterConfigs (else CLUSTER_AUTHORIZATION_FAILED).

        Raises:
            InvalidRequestError: the body cannot be parsed.
        """
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(INCREMENTAL_ALTER_CONFIGS, header.api_version)
        counts = collections.Counter((r.resource_type, r.resource_name) for r in body.resources)
        results, codes = [], []
        for resource in body.resources:
            error, message = ErrorCode.none, None
            try:
                if counts[(resource.resource_type, resource.resource_name)] > 1:
                    raise _Refused(ErrorCode.invalid_request, "Error due to duplicate resource in request")
                self._authorize_configs(request, resource, AclOperation.ALTER_CONFIGS)
                names = collections.Counter(c.name for c in resource.configs)
                if any(n > 1 for n in names.values()):
                    raise _Refused(ErrorCode.invalid_request, "Error due to duplicate config keys")
                ops = [(c.name, int(c.config_operation), c.value) for c in resource.configs]
                if resource.resource_type == TOPIC_RESOURCE:
                    await self._alter_topic(resource.resource_name, ops, body.validate_only)
                elif resource.resource_type == BROKER_RESOURCE:
                    self._check_broker_name(resource.resource_name)
                    for _name, op, _value in ops:
                        if op not in {o.value for o in AlterOp}:
                            raise _Refused(ErrorCode.invalid_request, f"Unknown alter config operation type {op}")
                    if ops:
                        raise _Refused(ErrorCode.invalid_config,
                                       "Cannot update these configs dynamically: "
                                       f"Set({', '.join(sorted(names))}) (this broker's configs come from its "
                                       "config file, environment and flags, read at start)")
                else:
                    raise _Refused(ErrorCode.invalid_request,
                                   f"Unsupported resource type {resource.resource_type}: only topics (2) and "
                                   "brokers (4) have configs here")
            except _Refused as exc:
                error, message = exc.error, exc.message
            codes.append(error)
            results.append(apis.make(module.AlterConfigsResourceResponse, error_code=error, error_message=message,
                                     resource_type=resource.resource_type, resource_name=resource.resource_name))
        self._complete(request, apis.make(module.IncrementalAlterConfigsResponse, throttle_time=apis.ZERO_MS,
                                          responses=tuple(results)), codes)

    async def _alter_topic(self, name: str, ops: list[tuple[str, int, str | None]], validate_only: bool) -> None:
        try:
            validate_topic_name(name)
        except ValueError as exc:
            raise _Refused(ErrorCode.invalid_topic_exception, str(exc)) from None
        topic = self.catalog.topic(name)
        if topic is None:
            raise _Refused(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")

        def update(current: Any) -> dict[str, str]:
            try:
                return self.configs.alter(current, ops)
            except InvalidConfigError as exc:
                raise _Refused(ErrorCode.invalid_config, str(exc)) from None
            except ValueError as exc:
                raise _Refused(ErrorCode.invalid_request, str(exc)) from None

        if validate_only:
            update(topic.configs)
            return
        try:
            await self.catalog.set_configs(name, update)
        except NoSuchTopicError:
            raise _Refused(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.") from None

    # -- DescribeCluster ---------------------------------------------------------------

    async def describe_cluster(self, request: Request) -> None:
        """DescribeCluster v0-v1 (KIP-700, KIP-919): this broker, the cluster id, and this
        broker as the controller. v1 ``endpoint_type`` 1 (brokers) is served; 2
        (controllers) is MISMATCHED_ENDPOINT_TYPE as on a Kafka broker; anything else
        UNSUPPORTED_ENDPOINT_TYPE. Authorized operations, when asked (KIP-430, Kafka
        ``AuthHelper.computeDescribeClusterResponse``): with CLUSTER Describe the cluster
        operations the principal is allowed (every one with no authorizer), without it 0;
        as in Kafka the request itself is never refused.

        Raises:
            InvalidRequestError: the body cannot be parsed.
        """
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DESCRIBE_CLUSTER, header.api_version)
        endpoint = int(getattr(body, "endpoint_type", 1))
        error, message = ErrorCode.none, None
        if endpoint == 2:
            error, message = (ErrorCode.mismatched_endpoint_type,
                              "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of "
                              "type CONTROLLER")
        elif endpoint != 1:
            error, message = ErrorCode.unsupported_endpoint_type, f"Unsupported endpoint type {endpoint}"
        b = self.broker.for_listener(request.connection.listener)
        brokers = () if error != ErrorCode.none else tuple(
            apis.make(module.DescribeClusterBroker, broker_id=n, host=h, port=p, rack=None)
            for n, h, p in b.all_brokers())
        self._complete(request, apis.make(
            module.DescribeClusterResponse, throttle_time=apis.ZERO_MS, error_code=error, error_message=message,
            endpoint_type=endpoint, cluster_id=b.cluster_id,
            controller_id=b.controller_id if error == ErrorCode.none else -1,
            brokers=brokers,
            cluster_authorized_operations=self._cluster_operations(request)
            if body.include_cluster_authorized_operations else _NO_AUTHORIZED_OPERATIONS), [error])

    def _cluster_operations(self, request: Request) -> int:
        """KIP-430 bit field of the CLUSTER operations allowed; 0 without CLUSTER Describe."""
        if not self._authorize(request, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return 0
        return sum(1 << op for op in _CLUSTER_OPERATION_CODES
                   if self._authorize(request, AclOperation(op), ResourceType.CLUSTER, CLUSTER_NAME, log_denied=False))

