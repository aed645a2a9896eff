"""The Schema Registry's HTTP layer: Confluent's REST routes (starlette) on hypercorn's trio worker.

Answers are ``application/vnd.schemaregistry.v1+json``; a refused request is
``{"error_code": N, "message": ...}`` with the status ``RegistryError.status`` (Confluent's
``RestException``). The ``SchemaRegistry`` calls block (database I/O) and run in a worker
thread. With ``authenticate`` set, every request needs HTTP basic authentication
(RFC 7617) as one of the broker's SCRAM users, as Redpanda's built-in registry checks
its SASL users; a request without valid credentials gets 401 (error code 40101).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pipeline.registry.service import RegistryError, SchemaRegistry

__all__ = ("CONTENT_TYPE", "RegistryListener", "registry_app", "serve_registry")

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
"""The media type of every answer (Confluent Schema Registry API v1)."""

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body read (bytes); a larger one is answered 413 without being read whole."""

Authenticate = Callable[[str, str], bool]
"""(user, password) -> whether they are valid; blocking (e.g. ``UserStore.verify_plain``)."""


@dataclass(frozen=True, slots=True)
class RegistryListener:
    """Where the registry listens: ``host``, ``port`` (0: a free one), and for HTTPS the PEM
    ``certfile`` and ``keyfile`` (the key may be in the certfile; ``keyfile`` None then)."""

    host: str
    port: int
    certfile: Path | None = None
    keyfile: Path | None = None


def _json(value: object, status: int = 200) -> Response:
    return JSONResponse(value, status_code=status, media_type=CONTENT_TYPE)


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() == "true"


def _credentials(request: Request) -> tuple[str, str] | None:
    header = request.headers.get("authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


async def _read_body(request: Request) -> bytes | None:
    """The request's body, None once it passes ``MAX_BODY_BYTES`` (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def registry_app(registry: SchemaRegistry, authenticate: Authenticate | None = None) -> Starlette:
    """The ASGI application serving ``registry``'s REST API (routes: Confluent's API reference)."""

    def handler(op: Callable[[Request, Any], Any], body: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if authenticate is not None:
                creds = _credentials(request)
                if creds is None or not await trio.to_thread.run_sync(authenticate, *creds):
                    response = _json({"error_code": 40101, "message": "Unauthorized"}, 401)
                    response.headers["WWW-Authenticate"] = 'Basic realm="pipeline schema registry"'
                    return response
            payload: Any = None
            if body:
                raw = await _read_body(request)
                if raw is None:
                    return _json({"error_code": 413, "message": f"Request body larger than {MAX_BODY_BYTES} bytes"},
                                 413)
                try:
                    payload = json.loads(raw or b"{}")
                except ValueError as exc:
                    return _json({"error_code": 400, "message": f"Malformed JSON: {exc}"}, 400)
                if not isinstance(payload, dict):
                    return _json({"error_code": 400, "message": "The request body must be a JSON object"}, 400)
            try:
                return _json(await trio.to_thread.run_sync(op, request, payload))
            except RegistryError as exc:
                return _json(exc.to_json(), exc.status)
            except Exception as exc:  # the store failed: the client may retry
                log.warning("schema registry: %s %s failed: %s", request.method, request.url.path, exc)
                return _json({"error_code": 50001, "message": f"Error in the backend data store: {exc}"}, 500)
        return endpoint

    def subject(request: Request) -> str:
        return str(request.path_params["subject"])

    def fmt(request: Request) -> str | None:
        return request.query_params.get("format") or None

    def schema_id(request: Request) -> int:
        try:
            return int(request.path_params["id"])
        except ValueError:
            raise RegistryError(40403, "Schema not found") from None

    r = registry
    # {subject:path}: a subject may hold "/" (confluent-kafka registers a Protobuf import as the subject named
    # by its file, e.g. "common/money.proto"; %2F arrives decoded). Starlette takes the first route that
    # matches, so a route ending in the subject comes after the ones with more after it.
    routes = [
        Route("/", handler(lambda q, b: {}), methods=["GET"]),
        Route("/schemas/types", handler(lambda q, b: r.schema_types()), methods=["GET"]),
        Route("/schemas/ids/{id}", handler(lambda q, b: r.schema_by_id(schema_id(q), fmt(q))), methods=["GET"]),
        Route("/schemas/ids/{id}/schema",
              handler(lambda q, b: json.loads(str(r.schema_by_id(schema_id(q))["schema"]))), methods=["GET"]),
        Route("/schemas/ids/{id}/versions", handler(lambda q, b: r.schema_versions(schema_id(q))), methods=["GET"]),
        Route("/schemas/guids/{guid}", handler(lambda q, b: r.schema_by_guid(str(q.path_params["guid"]), fmt(q))),
              methods=["GET"]),
        Route("/subjects", handler(lambda q, b: r.subjects(_flag(q, "deleted"))), methods=["GET"]),
        Route("/subjects/{subject:path}/versions", handler(lambda q, b: r.versions(subject(q), _flag(q, "deleted"))),
              methods=["GET"]),
        Route("/subjects/{subject:path}/versions", handler(lambda q, b: r.register(subject(q), b), body=True),
              methods=["POST"]),
        Route("/subjects/{subject:path}/versions/{version}",
              handler(lambda q, b: r.version(subject(q), q.path_params["version"], _flag(q, "deleted"), fmt(q))),
              methods=["GET"]),
        Route("/subjects/{subject:path}/versions/{version}",
              handler(lambda q, b: r.delete_version(subject(q), q.path_params["version"], _flag(q, "permanent"))),
              methods=["DELETE"]),
        Route("/subjects/{subject:path}/versions/{version}/schema",
              handler(lambda q, b: json.loads(str(r.version(subject(q), q.path_params["version"])["schema"]))),
              methods=["GET"]),
        Route("/subjects/{subject:path}/versions/{version}/referencedby",
              handler(lambda q, b: r.referenced_by(subject(q), q.path_params["version"])), methods=["GET"]),
        # after the /subjects/{subject:path}/... routes, which a subject taking the rest of the path would swallow
        Route("/subjects/{subject:path}", handler(lambda q, b: r.lookup(subject(q), b, _flag(q, "deleted"), fmt(q)),
                                             body=True), methods=["POST"]),
        Route("/subjects/{subject:path}", handler(lambda q, b: r.delete_subject(subject(q), _flag(q, "permanent"))),
              methods=["DELETE"]),
        Route("/compatibility/subjects/{subject:path}/versions",
              handler(lambda q, b: r.test_compatibility(subject(q), None, b, _flag(q, "verbose")), body=True),
              methods=["POST"]),
        Route("/compatibility/subjects/{subject:path}/versions/{version}",
              handler(lambda q, b: r.test_compatibility(subject(q), q.path_params["version"], b,
                                                        _flag(q, "verbose")), body=True), methods=["POST"]),
        Route("/config", handler(lambda q, b: r.get_config(None)), methods=["GET"]),
        Route("/config", handler(lambda q, b: r.set_config(None, b), body=True), methods=["PUT"]),
        Route("/config", handler(lambda q, b: r.delete_config(None)), methods=["DELETE"]),
        Route("/config/{subject:path}", handler(lambda q, b: r.get_config(subject(q), _flag(q, "defaultToGlobal"))),
              methods=["GET"]),
        Route("/config/{subject:path}", handler(lambda q, b: r.set_config(subject(q), b), body=True), methods=["PUT"]),
        Route("/config/{subject:path}", handler(lambda q, b: r.delete_config(subject(q))), methods=["DELETE"]),
        Route("/mode", handler(lambda q, b: r.get_mode(None)), methods=["GET"]),
        Route("/mode", handler(lambda q, b: r.set_mode(None, b), body=True), methods=["PUT"]),
        Route("/mode/{subject:path}", handler(lambda q, b: r.get_mode(subject(q), _flag(q, "defaultToGlobal"))),
              methods=["GET"]),
        Route("/mode/{subject:path}", handler(lambda q, b: r.set_mode(subject(q), b), body=True), methods=["PUT"]),
        Route("/mode/{subject:path}", handler(lambda q, b: r.delete_mode(subject(q))), methods=["DELETE"]),
    ]
    return Starlette(routes=routes)


async def serve_registry(registry: SchemaRegistry, listener: RegistryListener,
                         authenticate: Authenticate | None = None, *,
                         task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``registry`` on ``listener`` until cancelled; reports its base URL
    (``http[s]://HOST:PORT``) once listening.

    Raises:
        OSError: the address cannot be bound.
        ssl.SSLError, OSError: the certificate or key cannot be loaded.
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{listener.host}:{listener.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("pipeline.registry.http")
    if listener.certfile is not None:
        # Load once here so a bad file fails the start with its own error, not hypercorn's.
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(listener.certfile, listener.keyfile)
        config.certfile = str(listener.certfile)
        # hypercorn serves TLS only with both set; a PEM holding the key and the chain is both.
        config.keyfile = str(listener.keyfile or listener.certfile)
    app = registry_app(registry, authenticate)

    async def started_hypercorn(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(app, config, task_status=task_status)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(started_hypercorn)
        url = binds[0]
        log.info("schema registry: listening on %s%s", url, " (basic authentication)" if authenticate else "")
        task_status.started(url)
