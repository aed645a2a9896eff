"""SaslHandshake (17), SaslAuthenticate (36), DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51), served on ``KafkaApis``.

Each SASL_PLAINTEXT / SASL_SSL connection gets a ``SaslServer``
(``pipeline.security.sasl``) on its first SASL request; until it is COMPLETE,
``KafkaApis.handle`` serves such a connection nothing but ApiVersions,
SaslHandshake and SaslAuthenticate (it asks ``is_authenticated``). Success sets
the connection's ``principal`` to ``User:<name>``.

As Kafka (``SaslServerAuthenticator``, ``KafkaApis.handleSaslHandshakeRequest``):

* on a PLAINTEXT / SSL connection, or after authentication completed, both SASL
  apis answer ILLEGAL_SASL_STATE and the connection stays open;
* an unknown mechanism answers UNSUPPORTED_SASL_MECHANISM with the enabled
  ones, then the connection closes;
* a failed SaslAuthenticate answers SASL_AUTHENTICATION_FAILED with a message
  that does not say whether the user exists, after a delay that grows with the
  address's failures (``FailedAuthenticationThrottle``, KIP-306), then the
  connection closes; other connections are not held meanwhile (the delay runs
  in this object's own task, not in the request handler);
* a SASL request out of turn (a token before the handshake, a second
  handshake) closes the connection without an answer;
* after a SaslHandshake v0 the tokens come as raw frames (KIP-43; the
  connection is told so before the handshake's answer, and hands them on
  under ``RAW_SASL_TOKEN``): each gets the server's token as a raw frame, a
  failed one no answer at all (there is no error field) but the same delay,
  log line and counters, then the connection closes; once authentication
  completes, requests follow again. A SaslAuthenticate request in their place
  is a token like any other, which no mechanism accepts (Kafka does the same).

A failure is logged with the address, mechanism and user tried; never a
password, proof or key.
"""

from __future__ import annotations

import datetime
import logging
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

import trio
from kio.schema.errors import ErrorCode

from pipeline.protocol import apis
from pipeline.protocol.errors import InvalidRequestError
from pipeline.protocol.header import RAW_SASL_TOKEN
from pipeline.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from pipeline.security.sasl import (
    AuthenticationFailedError,
    FailedAuthenticationThrottle,
    IllegalSaslStateError,
    SaslServer,
    SaslState,
    UnsupportedMechanismError,
)
from pipeline.security.users import SCRAM_MECHANISMS, CredentialError, UserStore, credential_from_salted_password

if TYPE_CHECKING:
    from pipeline.network.request_channel import ConnectionHandle, Request
    from pipeline.requests.handler import KafkaApis

log = logging.getLogger(__name__)

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51
SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
_MECHANISM_NAMES = {v: k for k, v in SCRAM_MECHANISMS.items()}
_ZERO_LIFETIME = datetime.timedelta(0)  # KIP-368: 0 means no re-authentication required


class SaslApis:
    """The SASL and SCRAM-credential apis of one server.

    Args:
        users: the credential store (read at every authentication).
        enabled_mechanisms: ``sasl.enabled.mechanisms``.
        throttle: the failed-authentication delay per address.
        mechanisms_by_listener: listener name -> its mechanisms, where
            ``listener.name.<name>.sasl.enabled.mechanisms`` sets them (KIP-103).
    """

    def __init__(self, users: UserStore, enabled_mechanisms: tuple[str, ...],
                 throttle: FailedAuthenticationThrottle,
                 mechanisms_by_listener: dict[str, tuple[str, ...]] | None = None) -> None:
        self.users = users
        self.enabled_mechanisms = enabled_mechanisms
        self.mechanisms_by_listener = mechanisms_by_listener or {}
        self.throttle = throttle
        self._servers: weakref.WeakKeyDictionary[Any, SaslServer] = weakref.WeakKeyDictionary()
        self._nursery: trio.Nursery | None = None
        self.failures = 0
        """Failed authentications since start."""
        self.failed_by_listener: Counter[str] = Counter()
        """Failed SASL authentications by listener name (Kafka socket-server-metrics failed-authentication-total)."""
        self.successful_by_listener: Counter[str] = Counter()
        """Completed SASL authentications by listener name (Kafka successful-authentication-total)."""
        self._authorize: Callable[[Request, AclOperation, ResourceType, str], bool] = (
            lambda request, operation, resource_type, name: True)
        """``KafkaApis.authorize`` once registered."""

    def register(self, kafka_apis: KafkaApis) -> None:
        """Serve the four apis on ``kafka_apis`` and make it ask us who is authenticated."""
        kafka_apis.register(SASL_HANDSHAKE, self._handshake)
        kafka_apis.register(SASL_AUTHENTICATE, self._authenticate)
        kafka_apis.register(DESCRIBE_USER_SCRAM_CREDENTIALS, self._describe)
        kafka_apis.register(ALTER_USER_SCRAM_CREDENTIALS, self._alter)
        kafka_apis.serve_sasl(self.is_authenticated)
        self._authorize = kafka_apis.authorize

    def _cluster_allowed(self, request: Request, operation: AclOperation) -> bool:
        return self._authorize(request, operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def is_authenticated(self, connection: ConnectionHandle) -> bool:
        """Whether ``connection`` completed SASL authentication."""
        server = self._servers.get(connection)
        return server is not None and server.state is SaslState.COMPLETE

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the tasks that answer failures after their delay; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- SaslHandshake -----------------------------------------------------------

    async def _handshake(self, request: Request) -> None:
        header, connection = request.header, request.connection
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(SASL_HANDSHAKE, header.api_version)

        def answer(error: int, mechanisms: tuple[str, ...] = ()) -> None:
            connection.complete(request.token, apis.encode(header, apis.make(
                module.SaslHandshakeResponse, error_code=apis.error_code(error), mechanisms=mechanisms)))

        server = self._server(connection)
        if server is None or server.state is SaslState.COMPLETE:
            answer(ErrorCode.illegal_sasl_state.value)
            return
        try:
            enabled = server.handshake(body.mechanism, header.api_version)
        except IllegalSaslStateError as exc:
            raise InvalidRequestError(f"ILLEGAL_SASL_STATE: {exc}") from None
        except UnsupportedMechanismError as exc:
            self.failed_by_listener[connection.listener] += 1
            log.warning("connection %s from %s: %s", connection.connection_id, connection.peer_host, exc)
            answer(ErrorCode.unsupported_sasl_mechanism.value, exc.enabled)
            connection.close(str(exc))
            return
        if server.raw_tokens:
            connection.set_raw_sasl_tokens(True)  # before the answer: the client's next frame is a token
        answer(ErrorCode.none.value, enabled)

    # -- SaslAuthenticate ----------------------------------------------------------

    async def _authenticate(self, request: Request) -> None:
        header, connection = request.header, request.connection
        if header is RAW_SASL_TOKEN:
            self._raw_token(request)
            return
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(SASL_AUTHENTICATE, header.api_version)

        def payload(error: int, message: str | None = None, token: bytes = b"") -> bytes:
            return apis.encode(header, apis.make(
                module.SaslAuthenticateResponse, error_code=apis.error_code(error), error_message=message,
                auth_bytes=token, session_lifetime=_ZERO_LIFETIME))

        server = self._server(connection)
        if server is None or server.state is SaslState.COMPLETE:
            connection.complete(request.token, payload(
                ErrorCode.illegal_sasl_state.value,
                "SaslAuthenticate request received after successful authentication"
                if server is not None else "SASL is not enabled on this listener"))
            return
        try:
            step = server.authenticate(body.auth_bytes)
        except IllegalSaslStateError as exc:
            raise InvalidRequestError(f"ILLEGAL_SASL_STATE: {exc}") from None
        except AuthenticationFailedError as exc:
            self._failed(connection, request.token, server, exc,
                         payload(ErrorCode.sasl_authentication_failed.value, str(exc)))
            return
        if step.complete:
            self._authenticated(connection, server)
        connection.complete(request.token, payload(ErrorCode.none.value, None, step.token))

    def _raw_token(self, request: Request) -> None:
        """A raw SASL token after a SaslHandshake v0: the server's token back as a raw frame.

        Kafka ``SaslServerAuthenticator.handleSaslToken`` without SaslAuthenticate
        headers: a failure gets no answer (there is no error field), only the close
        after the failed-authentication delay.
        """
        connection = request.connection
        server = self._servers.get(connection)
        if server is None:
            raise InvalidRequestError("ILLEGAL_SASL_STATE: raw SASL token without a SaslHandshake v0")
        try:
            step = server.authenticate(bytes(request.frame), raw=True)
        except IllegalSaslStateError as exc:
            raise InvalidRequestError(f"ILLEGAL_SASL_STATE: {exc}") from None
        except AuthenticationFailedError as exc:
            self._failed(connection, request.token, server, exc, None)
            return
        if step.complete:
            connection.set_raw_sasl_tokens(False)  # before the answer: requests follow it
            self._authenticated(connection, server)
        connection.complete(request.token, step.token)

    def _authenticated(self, connection: ConnectionHandle, server: SaslServer) -> None:
        assert server.principal is not None
        connection.authenticated(server.principal)
        self.throttle.success(connection.peer_host)
        self.successful_by_listener[connection.listener] += 1
        log.info("connection %s from %s authenticated as %s (%s%s)", connection.connection_id,
                 connection.peer_host, server.principal, server.mechanism,
                 ", raw tokens after SaslHandshake v0" if server.raw_tokens else "")

    def _failed(self, connection: ConnectionHandle, token: int, server: SaslServer,
                exc: AuthenticationFailedError, failure: bytes | None) -> None:
        """Count and log a failed authentication; answer ``failure`` (None: no answer) and close,
        after the address's delay."""
        self.failures += 1
        self.failed_by_listener[connection.listener] += 1
        log.warning("failed authentication from %s (connection %s, mechanism %s, principal tried User:%s): %s",
                    connection.peer_host, connection.connection_id, server.mechanism, exc.user, exc)
        delay = self.throttle.failure(connection.peer_host, trio.current_time())
        reason = f"authentication failed ({server.mechanism}, principal tried User:{exc.user})"
        if delay > 0 and self._nursery is not None:
            self._nursery.start_soon(self._fail_later, connection, token, failure, reason, delay)
        else:
            self._fail(connection, token, failure, reason)

    def _server(self, connection: ConnectionHandle) -> SaslServer | None:
        """The connection's SaslServer (made on first use); None on a PLAINTEXT / SSL connection."""
        if connection.security_protocol not in SASL_PROTOCOLS:
            return None
        server = self._servers.get(connection)
        if server is None:
            mechanisms = self.mechanisms_by_listener.get(connection.listener, self.enabled_mechanisms)
            server = self._servers[connection] = SaslServer(mechanisms, self.users)
        return server

    @staticmethod
    def _fail(connection: ConnectionHandle, token: int, failure: bytes | None, reason: str) -> None:
        connection.complete(token, failure)
        connection.close(reason)

    async def _fail_later(self, connection: ConnectionHandle, token: int, failure: bytes | None, reason: str,
                          delay: float) -> None:
        await trio.sleep(delay)
        self._fail(connection, token, failure, reason)

    # -- DescribeUserScramCredentials / AlterUserScramCredentials (KIP-554) ---------

    async def _describe(self, request: Request) -> None:
        """DescribeUserScramCredentials; needs CLUSTER Describe, else CLUSTER_AUTHORIZATION_FAILED
        for the response and every named user (Kafka ``KafkaApis.handleDescribeUserScramCredentialsRequest``,
        ``DescribeUserScramCredentialsRequest.getErrorResponse``)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(DESCRIBE_USER_SCRAM_CREDENTIALS, header.api_version)
        if not self._cluster_allowed(request, AclOperation.DESCRIBE):
            denied, message = ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
            request.connection.complete(request.token, apis.encode(header, module.DescribeUserScramCredentialsResponse(
                throttle_time=apis.ZERO_MS, error_code=denied, error_message=message, results=tuple(
                    module.DescribeUserScramCredentialsResult(user=u.name, error_code=denied, error_message=message,
                                                              credential_infos=())
                    for u in body.users or ()))))
            return
        known = await trio.to_thread.run_sync(self.users.users)
        if body.users is None or not body.users:
            # Kafka: a null or empty list describes every user that has credentials.
            names, duplicates = list(known), set()
        else:
            names = [u.name for u in body.users]
            duplicates = {n for n in names if names.count(n) > 1}
            names = list(dict.fromkeys(names))

        def result(name: str) -> Any:
            if name in duplicates:
                error, message, infos = ErrorCode.duplicate_resource, f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}", ()
            elif name not in known:
                error, message, infos = ErrorCode.resource_not_found, f"Attempt to describe a user credential that does not exist: {name}", ()
            else:
                error, message = ErrorCode.none, None
                infos = tuple(module.CredentialInfo(mechanism=SCRAM_MECHANISMS[m], iterations=i)
                              for m, i in known[name].items())
            return module.DescribeUserScramCredentialsResult(user=name, error_code=error, error_message=message,
                                                             credential_infos=infos)

        request.connection.complete(request.token, apis.encode(header, module.DescribeUserScramCredentialsResponse(
            throttle_time=apis.ZERO_MS, error_code=ErrorCode.none, error_message=None,
            results=tuple(result(n) for n in names))))

    async def _alter(self, request: Request) -> None:
        """AlterUserScramCredentials; needs CLUSTER Alter, else every user named is
        CLUSTER_AUTHORIZATION_FAILED and nothing changes (Kafka
        ``ControllerApis.handleAlterUserScramCredentials``, ``AlterUserScramCredentialsRequest.getErrorResponse``)."""
        header = request.header
        body = apis.decode_request(header, request.frame)
        module = apis.response_module(ALTER_USER_SCRAM_CREDENTIALS, header.api_version)
        results: dict[str, tuple[ErrorCode, str | None]]  # user -> (error, message)
        if not self._cluster_allowed(request, AclOperation.ALTER):
            denied: tuple[ErrorCode, str | None] = (ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
            results = {u: denied for u in sorted({c.name for c in (*body.deletions, *body.upsertions)})}
        else:
            results = await trio.to_thread.run_sync(self._alter_store, body)
        log.info("connection %s (%s): AlterUserScramCredentials for %s", request.connection.connection_id,
                 request.connection.principal, ", ".join(f"{u}: {m or 'ok'}" for u, (_e, m) in results.items()))
        request.connection.complete(request.token, apis.encode(header, module.AlterUserScramCredentialsResponse(
            throttle_time=apis.ZERO_MS,
            results=tuple(module.AlterUserScramCredentialsResult(user=u, error_code=e, error_message=m)
                          for u, (e, m) in results.items()))))

    def _alter_store(self, body: Any) -> dict[str, tuple[ErrorCode, str | None]]:
        """Apply deletions and upsertions (worker thread); user -> (error, message), one per user.

        Kafka ``ControllerApis.alterUserScramCredentials``: a user named twice
        for one mechanism gets DUPLICATE_RESOURCE, an unknown mechanism
        UNSUPPORTED_SASL_MECHANISM, bad iterations/salt/name
        UNACCEPTABLE_CREDENTIAL, deleting a credential that does not exist
        RESOURCE_NOT_FOUND; a user with any error has none of its changes applied.
        """
        results: dict[str, tuple[ErrorCode, str | None]] = {}
        seen: dict[tuple[str, int], int] = {}
        for change in (*body.deletions, *body.upsertions):
            seen[(change.name, change.mechanism)] = seen.get((change.name, change.mechanism), 0) + 1
            results.setdefault(change.name, (ErrorCode.none, None))

        def fail(user: str, error: ErrorCode, message: str) -> None:
            if results[user][0] is ErrorCode.none:
                results[user] = (error, message)

        for change in (*body.deletions, *body.upsertions):
            user = change.name
            if seen[(user, change.mechanism)] > 1:
                fail(user, ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request")
            elif change.mechanism not in _MECHANISM_NAMES:
                fail(user, ErrorCode.unsupported_sasl_mechanism, f"Unknown SCRAM mechanism {change.mechanism}")
            elif not user:
                fail(user, ErrorCode.unacceptable_credential, "Username must not be empty")
        planned: list[tuple[str, Any]] = []
        for deletion in body.deletions:
            if results[deletion.name][0] is ErrorCode.none:
                mechanism = _MECHANISM_NAMES[deletion.mechanism]
                if self.users.get(deletion.name, mechanism) is None:
                    fail(deletion.name, ErrorCode.resource_not_found,
                         "Attempt to delete a user credential that does not exist")
                else:
                    planned.append((deletion.name, mechanism))
        for upsertion in body.upsertions:
            if results[upsertion.name][0] is ErrorCode.none:
                try:
                    planned.append((upsertion.name, credential_from_salted_password(
                        _MECHANISM_NAMES[upsertion.mechanism], upsertion.salt, upsertion.salted_password,
                        upsertion.iterations)))
                except CredentialError as exc:
                    fail(upsertion.name, ErrorCode.unacceptable_credential, str(exc))
        for user, change in planned:
            if results[user][0] is not ErrorCode.none:
                continue
            if isinstance(change, str):
                self.users.remove(user, change)
            else:
                self.users.put(user, change)
        return results
