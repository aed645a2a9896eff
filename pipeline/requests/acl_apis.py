"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31), and the request-side authorize check.

As Kafka's ``KafkaApis.handleDescribeAcls/handleCreateAcls/handleDeleteAcls``
with ``AclApis``: with no authorizer configured every answer is
SECURITY_DISABLED; otherwise DescribeAcls needs CLUSTER Describe, CreateAcls
and DeleteAcls CLUSTER Alter (CLUSTER_AUTHORIZATION_FAILED). A binding or
filter Kafka would refuse gets INVALID_REQUEST. Changes are written to the
``AclStore`` in a worker thread, then applied in memory, then answered, so
an answered change survives a restart. Changes other brokers of a cluster made
reach this broker's authorizer by ``refresh`` (the server calls it every
``pipeline.server.METADATA_REFRESH_S``): it reloads the store when its change
version moved, never between a change's write and its apply here.

``authorize_request`` is the one place a request's principal and host are
checked and denials are logged (Kafka's ``kafka.authorizer.logger``: INFO
line per denial with principal, host, operation and resource; never a
credential).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from pipeline.protocol import apis
from pipeline.network.api_host import ApiHost
from pipeline.network.request_channel import Request
from pipeline.security.acl import (CLUSTER_NAME, AclBinding, AclBindingFilter, AclOperation, Authorizer,
                                   InvalidAclError, ResourceType, binding)
from pipeline.security.acl_store import AclStore

__all__ = ("CREATE_ACLS", "DELETE_ACLS", "DESCRIBE_ACLS", "AclApis", "authorize_request")

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31

authorizer_log = logging.getLogger("pipeline.authorizer")
"""Denials at INFO, grants at DEBUG (Kafka's ``kafka.authorizer.logger``)."""


def authorize_request(authorizer: Authorizer, request: Request, operation: AclOperation,
                      resource_type: ResourceType, name: str, log_denied: bool = True) -> bool:
    """``authorizer``'s decision for the request's connection principal and peer host.

    Logs ``Principal = ... is Denied Operation = ... from host = ... on resource = ...``
    at INFO when denied (unless ``log_denied`` is False: Kafka's ``logIfDenied``
    for filtered listings), at DEBUG when allowed.
    """
    connection = request.connection
    principal, host = connection.principal, connection.peer_host
    allowed = authorizer.authorize(principal, host, operation, resource_type, name)
    if not allowed and log_denied or allowed and authorizer_log.isEnabledFor(logging.DEBUG):
        authorizer_log.log(
            logging.DEBUG if allowed else logging.INFO,
            "Principal = %s is %s Operation = %s from host = %s on resource = %s:%s for request = %s",
            principal, "Allowed" if allowed else "Denied", operation.name, host, resource_type.name, name,
            apis.api_name(request.header.api_key))
    return allowed


class AclApis:
    """Serves the three ACL apis (``register`` them on ``KafkaApis``).

    Args:
        authorizer: the broker's authorizer; None: no authorizer configured
            (every answer SECURITY_DISABLED, Kafka's behaviour).
        store: where ACL changes are persisted (None: memory only, for tests).
    """

    def __init__(self, authorizer: Authorizer | None, store: AclStore | None = None) -> None:
        self.authorizer = authorizer
        self.store = store
        self._kafka_apis: ApiHost | None = None
        self._version: int | None = None  # the store's change version the authorizer holds; None: unknown
        self._changing = trio.Lock()  # a reload never lands between a change's store write and its apply

    async def refresh(self) -> bool:
        """Take the ACL changes other brokers (other processes, other hosts) made: when the store's
        change version moved since the last look, reload every binding into the authorizer. True if
        it reloaded. One single-row read otherwise (in a worker thread).

        Raises:
            sqlite3.Error, psycopg.Error: the store cannot be read (the authorizer is left as it was).
        """
        if self.authorizer is None or self.store is None:
            return False
        store = self.store
        async with self._changing:
            version = await trio.to_thread.run_sync(store.change_version)
            if version == self._version:
                return False
            # Read after the version: a change committed in between moves it again, and is reloaded next time.
            acls = await trio.to_thread.run_sync(store.load)
            self.authorizer.replace(acls)
            self._version = version
        return True

    def register(self, kafka_apis: ApiHost) -> None:
        """Serve DescribeAcls, CreateAcls and DeleteAcls on ``kafka_apis``."""
        self._kafka_apis = kafka_apis
        kafka_apis.register(DESCRIBE_ACLS, self.describe_acls)
        kafka_apis.register(CREATE_ACLS, self.create_acls)
        kafka_apis.register(DELETE_ACLS, self.delete_acls)

    def _cluster_allowed(self, request: Request, operation: AclOperation) -> bool:
        assert self.authorizer is not None
        return authorize_request(self.authorizer, request, operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def _complete(self, request: Request, body: Any, codes: Iterable[int]) -> None:
        if self._kafka_apis is not None:
            errors = self._kafka_apis.request_metrics.errors(request.header.api_key)
            for code in codes:
                errors[code] = errors.get(code, 0) + 1
        request.connection.complete(request.token, apis.encode(request.header, body))

    # -- DescribeAcls ------------------------------------------------------------

    async def describe_acls(self, request: Request) -> None:
        """DescribeAcls v1-v3: the bindings the filter matches, grouped by resource pattern."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DESCRIBE_ACLS, header.api_version)
        error, message, found = ErrorCode.none, None, []
        if self.authorizer is None:
            error, message = ErrorCode.security_disabled, "No Authorizer is configured."
        elif not self._cluster_allowed(request, AclOperation.DESCRIBE):
            error, message = ErrorCode.cluster_authorization_failed, None
        else:
            acl_filter = AclBindingFilter.from_wire(
                body.resource_type_filter, body.resource_name_filter, getattr(body, "pattern_type_filter", 3),
                body.principal_filter, body.host_filter, body.operation, body.permission_type)
            try:
                acl_filter.validate()
                found = self.authorizer.describe(acl_filter)
            except InvalidAclError as exc:
                error, message = ErrorCode.invalid_request, str(exc)
        by_pattern: dict[tuple[int, str, int], list[AclBinding]] = {}
        for acl in found:
            by_pattern.setdefault((int(acl.resource_type), acl.resource_name, int(acl.pattern_type)), []).append(acl)
        resources = tuple(
            apis.make(module.DescribeAclsResource, resource_type=rtype, resource_name=name, pattern_type=ptype,
                      acls=tuple(apis.make(module.AclDescription, principal=a.principal, host=a.host,
                                           operation=int(a.operation), permission_type=int(a.permission))
                                 for a in acls))
            for (rtype, name, ptype), acls in by_pattern.items())
        response = apis.make(module.DescribeAclsResponse, throttle_time=apis.ZERO_MS, error_code=error,
                             error_message=message, resources=resources)
        self._complete(request, response, [int(error)])

    # -- CreateAcls --------------------------------------------------------------

    async def create_acls(self, request: Request) -> None:
        """CreateAcls v1-v3: one result per creation, in order (Kafka ``AclApis.handleCreateAcls``)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(CREATE_ACLS, header.api_version)
        results: list[tuple[ErrorCode, str | None]] = []
        valid: list[AclBinding] = []
        if self.authorizer is None:
            results = [(ErrorCode.security_disabled, "No Authorizer is configured.")] * len(body.creations)
        elif not self._cluster_allowed(request, AclOperation.ALTER):
            results = [(ErrorCode.cluster_authorization_failed, None)] * len(body.creations)
        else:
            for c in body.creations:
                acl = binding(c.resource_type, c.resource_name, getattr(c, "resource_pattern_type", 3),
                              c.principal, c.host, c.operation, c.permission_type)
                try:
                    acl.validate()
                except InvalidAclError as exc:
                    results.append((ErrorCode.invalid_request, f"Invalid ACL: {exc}"))
                    continue
                valid.append(acl)
                results.append((ErrorCode.none, None))
            if valid:
                async with self._changing:
                    try:
                        if self.store is not None:
                            await trio.to_thread.run_sync(self.store.add, valid)
                    except Exception as exc:  # the disk: nothing of this request is applied
                        authorizer_log.error("storing ACLs failed: %s", exc)
                        results = [(ErrorCode.unknown_server_error, "storing the ACLs failed")
                                   if e == ErrorCode.none else (e, m) for e, m in results]
                    else:
                        for acl in valid:
                            self.authorizer.add(acl)
                            authorizer_log.info("ACL created: %s", acl)
        response = apis.make(module.CreateAclsResponse, throttle_time=apis.ZERO_MS, results=tuple(
            apis.make(module.AclCreationResult, error_code=e, error_message=m) for e, m in results))
        self._complete(request, response, [int(e) for e, _ in results])

    # -- DeleteAcls --------------------------------------------------------------

    async def delete_acls(self, request: Request) -> None:
        """DeleteAcls v1-v3: per filter, the bindings it removed (Kafka ``AclApis.handleDeleteAcls``)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DELETE_ACLS, header.api_version)
        outcomes: list[tuple[ErrorCode, str | None, list[AclBinding]]] = []
        if self.authorizer is None:
            outcomes = [(ErrorCode.security_disabled, "No Authorizer is configured.", [])] * len(body.filters)
        elif not self._cluster_allowed(request, AclOperation.ALTER):
            outcomes = [(ErrorCode.cluster_authorization_failed, None, [])] * len(body.filters)
        else:
            async with self._changing:  # matched and deleted against one version of the ACLs
                doomed: dict[AclBinding, None] = {}
                for f in body.filters:
                    acl_filter = AclBindingFilter.from_wire(
                        f.resource_type_filter, f.resource_name_filter, getattr(f, "pattern_type_filter", 3),
                        f.principal_filter, f.host_filter, f.operation, f.permission_type)
                    try:
                        acl_filter.validate()
                    except InvalidAclError as exc:
                        outcomes.append((ErrorCode.invalid_request, str(exc), []))
                        continue
                    matched = self.authorizer.describe(acl_filter)
                    doomed.update(dict.fromkeys(matched))
                    outcomes.append((ErrorCode.none, None, matched))
                if doomed:
                    try:
                        if self.store is not None:
                            await trio.to_thread.run_sync(self.store.remove, list(doomed))
                    except Exception as exc:
                        authorizer_log.error("deleting stored ACLs failed: %s", exc)
                        outcomes = [(ErrorCode.unknown_server_error, "deleting the ACLs failed", [])
                                    if e == ErrorCode.none else (e, m, a) for e, m, a in outcomes]
                    else:
                        self.authorizer.discard(doomed)
                        for acl in doomed:
                            authorizer_log.info("ACL deleted: %s", acl)
        results = tuple(
            apis.make(module.DeleteAclsFilterResult, error_code=e, error_message=m, matching_acls=tuple(
                apis.make(module.DeleteAclsMatchingAcl, error_code=ErrorCode.none, error_message=None,
                          resource_type=int(a.resource_type), resource_name=a.resource_name,
                          pattern_type=int(a.pattern_type), principal=a.principal, host=a.host,
                          operation=int(a.operation), permission_type=int(a.permission))
                for a in matched))
            for e, m, matched in outcomes)
        response = apis.make(module.DeleteAclsResponse, throttle_time=apis.ZERO_MS, filter_results=results)
        self._complete(request, response, [int(e) for e, _, _ in outcomes])
