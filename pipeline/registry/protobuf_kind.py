"""Protobuf schemas in the registry (Confluent schema type ``PROTOBUF``): parsing both forms clients
register, the ``serialized`` format, and Confluent's Protobuf compatibility rules.

Two forms of schema text arrive:

- a base64 serialized ``FileDescriptorProto`` (confluent-kafka's Python ``ProtobufSerializer``,
  ``_schema_to_str``), parsed with the ``protobuf`` package;
- ``.proto`` source (the Java and Go serializers, hand registrations), compiled with ``protoc`` as
  ``grpcio-tools`` bundles it (``python -m grpc_tools.protoc``, in a child process so its messages can be
  returned as the 42201 text), the file named ``default`` as Confluent's ``ProtobufSchema.DEFAULT_NAME``.

References are resolved by their import names (a reference's ``name`` is the ``.proto`` file name the
schema imports). The well-known files (``google/protobuf/*.proto`` and ``google/type/*.proto``) are
there without a reference, as confluent-kafka's serializer skips them (``_is_builtin``); the
``confluent/*.proto`` files it also skips are not (a schema importing one is refused).

``can_read(reader, writer)`` follows Confluent's ``ProtobufSchema.isBackwardCompatible``:
``SchemaDiff.compare(original=writer, update=reader)``, and the change is compatible when every
difference found is in ``SchemaDiff.COMPATIBLE_CHANGES`` (Confluent schema-registry,
``protobuf-provider/.../protobuf/diff/``: ``SchemaDiff``, ``MessageSchemaDiff``, ``FieldSchemaDiff``,
``EnumSchemaDiff``, ``Context``), here on resolved descriptors rather than on Square Wire's syntax tree.
Covered, with Confluent's ``Difference.Type`` names in the reasons:

- ``PACKAGE_CHANGED``; a top-level or nested message removed (``MESSAGE_REMOVED``; added or moved: fine);
  enums and enum constants added, removed or renamed: fine;
- fields matched by number across the whole message (oneof members included): added or removed fine,
  unless ``required`` (``REQUIRED_FIELD_ADDED``/``_REMOVED``); renamed fine;
- the field's kind (scalar, message, map; an enum counts as a scalar) changed: ``FIELD_KIND_CHANGED``;
  scalars are in Confluent's wire groups (int32 int64 uint32 uint64 bool enum | sint32 sint64 |
  string bytes | fixed32 sfixed32 | fixed64 sfixed64 | float | double) and a change across groups is
  ``FIELD_SCALAR_KIND_CHANGED``; an explicit label changed on a numeric field (optional, required,
  repeated; proto3's implicit presence has none, as in Wire) is ``FIELD_NUMERIC_LABEL_CHANGED``
  (string/bytes: fine); map keys and values compared as fields;
- message-typed fields: another message name (without its package) is ``FIELD_NAMED_TYPE_CHANGED``; a
  message from another file (a reference or a well-known type) is compared field by field, and an
  incompatible difference there is reported with ``FIELD_NAMED_TYPE_CHANGED`` (messages of the schema's
  own file are compared by the walk over its types, as Confluent does);
- oneofs: a member removed while the oneof stays or some members survive (``ONEOF_FIELD_REMOVED``),
  fields from two origins (two oneofs, or a top-level field and another group) now in one oneof
  (``MULTIPLE_FIELDS_MOVED_TO_ONEOF`` when more than one top-level field moved in, else
  ``FIELD_MOVED_TO_EXISTING_ONEOF``); a oneof added or removed whole, a member moved out: fine.

Not covered: extensions (``extend`` fields: Confluent compares them, this does not), custom options
and Confluent's ``confluent/meta.proto`` annotations, ``normalize``, the ``ignore_extensions`` format;
editions (``edition = "2023"``) files are compared by their labels as proto2 ones.

Sans-I/O but for ``protoc``'s child process and its scratch directory; parsed schemas are cached by
(text, references), so a subject's versions are compiled once per process.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.registry.schema_kind import InvalidSchema, Reference

__all__ = ("MAIN_FILE", "PROTOBUF", "ProtobufKind", "ProtobufSchema", "builtin_file")

PROTOBUF = "PROTOBUF"
MAIN_FILE = "default"
"""The file name of a schema registered as ``.proto`` text (Confluent ``ProtobufSchema.DEFAULT_NAME``)."""

_BUILTIN_PREFIXES = ("google/protobuf/", "google/type/")
_IMPORT_RE = re.compile(r'\bimport\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;')
_PROTOC_TIMEOUT_S = 60.0

# Confluent FieldSchemaDiff.scalarKind: the groups within which a scalar's type may change.
_SCALAR_GROUPS = {
    "int32": "GENERAL_NUMBER", "int64": "GENERAL_NUMBER", "uint32": "GENERAL_NUMBER",
    "uint64": "GENERAL_NUMBER", "bool": "GENERAL_NUMBER", "enum": "GENERAL_NUMBER",
    "sint32": "SIGNED_NUMBER", "sint64": "SIGNED_NUMBER",
    "string": "STRING_OR_BYTES", "bytes": "STRING_OR_BYTES",
    "fixed32": "FIXED32", "sfixed32": "FIXED32",
    "fixed64": "FIXED64", "sfixed64": "FIXED64",
    "float": "FLOAT", "double": "DOUBLE",
}


def builtin_file(name: str) -> Any | None:
    """The ``FileDescriptorProto`` of well-known file ``name`` (``google/protobuf/timestamp.proto``,
    ``google/type/date.proto``...) from the protobuf runtime and googleapis-common-protos; None if
    ``name`` is not one."""
    if not name.startswith(_BUILTIN_PREFIXES) or not name.endswith(".proto"):
        return None
    from google.protobuf import descriptor_pb2

    try:
        module = importlib.import_module(name[: -len(".proto")].replace("/", ".") + "_pb2")
    except ImportError:
        return None
    return descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)


@dataclass(frozen=True, eq=False)
class ProtobufSchema:
    """A parsed Protobuf schema: ``file`` (the schema's own ``FileDescriptorProto``, type names
    resolved to ``.package.Name``) and ``deps`` (every file it imports, directly or not, in
    dependency order), as ``protobuf``'s ``descriptor_pb2`` messages; ``referenced`` names the files
    that came as references (the others of ``deps`` are well-known files)."""

    file: Any
    deps: tuple[Any, ...]
    referenced: frozenset[str]
    _pool: Any = field(default=None, repr=False)

    @property
    def pool(self) -> Any:
        """A ``DescriptorPool`` holding ``deps`` and ``file`` (built once)."""
        return self._pool

    def serialized(self) -> str:
        """Base64 of the serialized ``FileDescriptorProto`` (Confluent's ``format=serialized``)."""
        return base64.standard_b64encode(self.file.SerializeToString(deterministic=True)).decode("ascii")

    def message(self, indexes: Sequence[int]) -> Any:
        """The message ``Descriptor`` at Confluent's message ``indexes`` (``[0]``: the file's first
        message; ``[1, 0]``: the second's first nested one).

        Raises:
            LookupError: no message there.
        """
        if not indexes:
            raise LookupError("empty message index list")
        messages = self.pool.FindFileByName(self.file.name).message_types_by_name
        candidates = list(messages.values())
        desc: Any = None
        for depth, i in enumerate(indexes):
            if not 0 <= i < len(candidates):
                where = "top-level" if depth == 0 else f"nested in {desc.full_name}"
                raise LookupError(f"message index {list(indexes)}: no message {i} {where} "
                                  f"({len(candidates)} there)")
            desc = candidates[i]
            candidates = list(desc.nested_types)
        return desc


class ProtobufKind:
    """Protobuf (``protobuf`` descriptors; ``protoc`` from ``grpcio-tools`` for ``.proto`` text)."""

    @staticmethod
    def canonical(text: str) -> str:
        """A serialized form: its ``FileDescriptorProto`` re-serialized deterministically, base64;
        ``.proto`` text: as registered, less surrounding whitespace (Confluent prints its own
        canonical form; two spellings of one ``.proto`` are two schemas here)."""
        proto = _decode_serialized(text)
        if proto is not None:
            return base64.standard_b64encode(proto.SerializeToString(deterministic=True)).decode("ascii")
        if not text.strip():
            raise InvalidSchema("Invalid schema: empty Protobuf schema")
        return text.strip()

    @staticmethod
    def parse(text: str, references: Sequence[Reference]) -> ProtobufSchema:
        return _parse(text, tuple(references))

    @staticmethod
    def can_read(reader: object, writer: object) -> list[str]:
        if not isinstance(reader, ProtobufSchema) or not isinstance(writer, ProtobufSchema):
            return ["a Protobuf schema can only be compared with another"]
        diff = _Diff(_Types(writer), _Types(reader))
        diff.files(writer.file, reader.file)
        return diff.incompatible

    @staticmethod
    def formatted(parsed: object, fmt: str) -> str | None:
        """The schema in format ``fmt``: ``serialized`` (base64 ``FileDescriptorProto``); None for a
        format this kind does not serve (the registered text is answered, as Confluent does)."""
        if fmt == "serialized" and isinstance(parsed, ProtobufSchema):
            return parsed.serialized()
        return None


# --------------------------------------------------------------------------- parsing


def _decode_serialized(text: str) -> Any | None:
    """The ``FileDescriptorProto`` of a base64 serialized form, None if ``text`` is not one (``.proto``
    source always has a space, which base64 never does)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    stripped = text.strip()
    if not stripped or any(c.isspace() for c in stripped):
        return None
    try:
        raw = base64.b64decode(stripped, validate=True)
        return descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None


@functools.lru_cache(maxsize=256)
def _parse(text: str, references: tuple[Reference, ...]) -> ProtobufSchema:
    """Raises ``InvalidSchema``: not a schema, an import with no reference, a reference not PROTOBUF."""
    available: dict[str, Any] = {}
    for name, ref_type, ref_text in references:  # dependencies first
        if ref_type != PROTOBUF:
            raise InvalidSchema(f"Invalid schema: a Protobuf schema cannot reference a {ref_type} schema ({name})")
        ref = _decode_serialized(ref_text)
        if ref is None:
            ref = _compile(ref_text, name, available)
        ref.name = name  # the import name wins over the name inside the descriptor (confluent _str_to_proto)
        available[name] = ref
    main = _decode_serialized(text)
    if main is None:
        main = _compile(text, MAIN_FILE, available)
    elif not main.name:
        main.name = MAIN_FILE
    return _resolve(main, available)


def _imports(proto: Any, available: dict[str, Any]) -> Iterator[Any]:
    """``proto``'s imports, transitively, dependencies first (each once)."""
    seen: set[str] = set()

    def visit(file: Any, path: tuple[str, ...]) -> Iterator[Any]:
        for dep in file.dependency:
            if dep in path:
                raise InvalidSchema(f"Invalid schema: import cycle through {dep}")
            if dep in seen:
                continue
            found = available.get(dep) or builtin_file(dep)
            if found is None:
                raise InvalidSchema(f"Invalid schema: {file.name or MAIN_FILE} imports {dep}, which is neither a "
                                    "reference nor a well-known file")
            yield from visit(found, (*path, dep))
            seen.add(dep)
            yield found

    yield from visit(proto, (proto.name,))


def _resolve(main: Any, available: dict[str, Any]) -> ProtobufSchema:
    """``main`` added to a pool with its imports: its names checked and resolved."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    deps = tuple(_imports(main, available))
    try:
        for dep in deps:
            pool.Add(dep)
        pool.Add(main)
        resolved = descriptor_pb2.FileDescriptorProto()
        pool.FindFileByName(main.name).CopyToProto(resolved)
    except Exception as exc:  # noqa: BLE001 - the pool's errors are TypeError, KeyError, its own Error
        raise InvalidSchema(f"Invalid schema: {type(exc).__name__}: {exc}") from exc
    return ProtobufSchema(resolved, deps, frozenset(d.name for d in deps if d.name in available), pool)


def _compile(text: str, name: str, available: dict[str, Any]) -> Any:
    """The ``FileDescriptorProto`` of ``.proto`` source ``text`` as file ``name``, by ``protoc``;
    imports come from ``available`` (earlier references) and the well-known files.

    Raises:
        InvalidSchema: protoc refused it (its message).
    """
    from google.protobuf import descriptor_pb2

    imported = set(_IMPORT_RE.findall(text))
    known = descriptor_pb2.FileDescriptorSet()
    added: set[str] = set()

    def add(file: Any) -> None:
        if file.name in added:
            return
        for dep in file.dependency:
            found = available.get(dep) or builtin_file(dep)
            if found is not None:
                add(found)
        added.add(file.name)
        known.file.append(file)

    for dep in sorted(imported):
        found = available.get(dep) or builtin_file(dep)
        if found is None:
            raise InvalidSchema(f"Invalid schema: {name} imports {dep}, which is neither a reference nor a "
                                "well-known file")
        add(found)
    with tempfile.TemporaryDirectory(prefix="pipeline-protoc-") as tmp:
        source = os.path.join(tmp, "src")
        os.makedirs(os.path.dirname(os.path.join(source, name)), exist_ok=True)
        with open(os.path.join(source, name), "w", encoding="utf-8") as src:
            src.write(text)
        deps_in, out = os.path.join(tmp, "deps.pb"), os.path.join(tmp, "out.pb")
        with open(deps_in, "wb") as deps_file:
            deps_file.write(known.SerializeToString())
        args = [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={source}", f"--descriptor_set_out={out}"]
        if known.file:
            args.append(f"--descriptor_set_in={deps_in}")
        try:
            done = subprocess.run([*args, name], capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InvalidSchema(f"Invalid schema: protoc could not be run: {exc}") from exc
        if done.returncode != 0:
            message = " ".join((done.stderr or done.stdout).replace(source + os.sep, "").split())
            raise InvalidSchema(f"Invalid schema: {message or f'protoc exited with {done.returncode}'}")
        with open(out, "rb") as compiled_file:
            compiled = descriptor_pb2.FileDescriptorSet.FromString(compiled_file.read())
    return next(file for file in compiled.file if file.name == name)


# ---------------------------------------------------------------- compatibility


@dataclass(frozen=True, slots=True)
class _TypeInfo:
    """A named type of a schema: its proto (``DescriptorProto`` or ``EnumDescriptorProto``), the
    package and file it comes from, and whether it is a map entry."""

    proto: Any
    package: str
    file: str
    syntax: str
    is_enum: bool
    is_map: bool


class _Types:
    """Every named type a schema sees (its file, references, well-known files), by full name."""

    def __init__(self, schema: ProtobufSchema) -> None:
        self.main = schema.file.name
        self.by_name: dict[str, _TypeInfo] = {}
        for file in (*schema.deps, schema.file):
            prefix = f".{file.package}" if file.package else ""
            self._collect(file, prefix, file.package, file.name, file.syntax or "proto2")

    def _collect(self, scope: Any, prefix: str, package: str, file: str, syntax: str) -> None:
        for enum in scope.enum_type:
            self.by_name[f"{prefix}.{enum.name}"] = _TypeInfo(enum, package, file, syntax, True, False)
        messages = scope.message_type if hasattr(scope, "message_type") else scope.nested_type
        for message in messages:
            full = f"{prefix}.{message.name}"
            self.by_name[full] = _TypeInfo(message, package, file, syntax, False, message.options.map_entry)
            self._collect(message, full, package, file, syntax)


def _label(field: Any, syntax: str) -> str | None:
    """Wire's label of a field: None for proto3's implicit presence, else optional/required/repeated."""
    from google.protobuf import descriptor_pb2 as d

    if field.label == d.FieldDescriptorProto.LABEL_REPEATED:
        return "repeated"
    if field.label == d.FieldDescriptorProto.LABEL_REQUIRED:
        return "required"
    if syntax == "proto3" and not field.proto3_optional:
        return None
    return "optional"


def _scalar_name(field: Any) -> str | None:
    """``int32``, ``string``, ``enum``... for a scalar or enum field; None for a message."""
    from google.protobuf import descriptor_pb2 as d

    t = field.type
    if t in (d.FieldDescriptorProto.TYPE_MESSAGE, d.FieldDescriptorProto.TYPE_GROUP):
        return None
    if t == d.FieldDescriptorProto.TYPE_ENUM:
        return "enum"
    return d.FieldDescriptorProto.Type.Name(t).removeprefix("TYPE_").lower()


class _Diff:
    """Confluent's ``SchemaDiff`` over two schemas' types: ``incompatible`` collects the reasons
    (``{errorType:"...", path}``) of every difference not in ``COMPATIBLE_CHANGES``."""

    def __init__(self, original: _Types, update: _Types) -> None:
        self.original = original
        self.update = update
        self.incompatible: list[str] = []
        self._comparing: set[str] = set()  # Context.enterSchema: a message being compared (recursion)

    def add(self, kind: str, path: str) -> None:
        self.incompatible.append(f'{{errorType:"{kind}", path:"{path}"}}')

    def files(self, original: Any, update: Any) -> None:
        if original.package != update.package:
            self.add("PACKAGE_CHANGED", "#/")
        self.types(original.message_type, update.message_type, "#",
                   (original.syntax or "proto2", update.syntax or "proto2"))

    def types(self, original: Sequence[Any], update: Sequence[Any], path: str, syntax: tuple[str, str]) -> None:
        """SchemaDiff.compareTypeElements: messages by name (map entries are compared as map fields);
        enums added, removed or changed are all compatible."""
        before = {m.name: m for m in original if not m.options.map_entry}
        after = {m.name: m for m in update if not m.options.map_entry}
        for name in sorted(before.keys() | after.keys()):
            if name not in after:
                self.add("MESSAGE_REMOVED", f"{path}/{name}")
            elif name in before:
                self.message(before[name], after[name], f"{path}/{name}", syntax)

    def message(self, original: Any, update: Any, path: str, syntax: tuple[str, str],
                key: str | None = None) -> None:
        """MessageSchemaDiff.compare (``syntax``: the original's file's and the update's)."""
        key = key or path
        if key not in self._comparing:
            self._comparing.add(key)
            try:
                self._fields(original, update, path, syntax)
            finally:
                self._comparing.discard(key)
        self.types(original.nested_type, update.nested_type, path, syntax)

    def _fields(self, original: Any, update: Any, path: str, syntax: tuple[str, str]) -> None:
        o_by_tag, o_oneof, o_oneofs = _fields_by_tag(original)
        u_by_tag, u_oneof, u_oneofs = _fields_by_tag(update)
        deleted_whole = {name for name, tags in o_oneofs.items()
                         if name not in u_oneofs and not any(t in u_by_tag for t in tags)}
        for name, tags in u_oneofs.items():
            groups: set[str] = set()
            moved_in = 0
            for tag in tags:
                if tag in o_oneof:
                    groups.add("oneof:" + o_oneof[tag])
                elif tag in o_by_tag:
                    groups.add(f"field:{tag}")
                    moved_in += 1
            if len(groups) > 1:
                self.add("MULTIPLE_FIELDS_MOVED_TO_ONEOF" if moved_in > 1 else "FIELD_MOVED_TO_EXISTING_ONEOF",
                         f"{path}/{name}")
        o_syntax, u_syntax = syntax
        for tag in sorted(o_by_tag.keys() | u_by_tag.keys()):
            o_field, u_field = o_by_tag.get(tag), u_by_tag.get(tag)
            if u_field is None:
                if tag in o_oneof:
                    if o_oneof[tag] not in deleted_whole:
                        self.add("ONEOF_FIELD_REMOVED", f"{path}/{o_oneof[tag]}/{tag}")
                elif _label(o_field, o_syntax) == "required":
                    self.add("REQUIRED_FIELD_REMOVED", f"{path}/{tag}")
            elif o_field is None:
                if tag not in u_oneof and _label(u_field, u_syntax) == "required":
                    self.add("REQUIRED_FIELD_ADDED", f"{path}/{tag}")
            else:
                where = f"{path}/{u_oneof[tag]}/{tag}" if tag in u_oneof else f"{path}/{tag}"
                self.field(o_field, u_field, _label(o_field, o_syntax), _label(u_field, u_syntax), where)

    def field(self, o_field: Any, u_field: Any, o_label: str | None, u_label: str | None, path: str) -> None:
        """FieldSchemaDiff.compareLabelsAndTypes (a name change is compatible)."""
        o_kind, u_kind = self._kind(o_field, True), self._kind(u_field, False)
        if o_kind != u_kind:
            self.add("FIELD_KIND_CHANGED", path)
        elif o_kind == "scalar":
            o_group = _SCALAR_GROUPS[_scalar_name(o_field) or ""]
            if o_group != _SCALAR_GROUPS[_scalar_name(u_field) or ""]:
                self.add("FIELD_SCALAR_KIND_CHANGED", path)
            elif (o_label is not None and u_label is not None and o_label != u_label
                  and o_group != "STRING_OR_BYTES"):
                self.add("FIELD_NUMERIC_LABEL_CHANGED", path)
        elif o_kind == "map":
            o_entry = self.original.by_name[o_field.type_name].proto
            u_entry = self.update.by_name[u_field.type_name].proto
            for i in (0, 1):  # key, then value
                self.field(o_entry.field[i], u_entry.field[i], None, None, path)
        else:
            self._message_field(o_field.type_name, u_field.type_name, path)

    def _kind(self, field: Any, original: bool) -> str:
        if _scalar_name(field) is not None:
            return "scalar"
        info = (self.original if original else self.update).by_name.get(field.type_name)
        return "map" if info is not None and info.is_map else "message"

    def _message_field(self, o_name: str, u_name: str, path: str) -> None:
        """FieldSchemaDiff.compareMessageTypes: same name without the package, and a message of
        another file compared field by field."""
        o_info, u_info = self.original.by_name.get(o_name), self.update.by_name.get(u_name)
        if o_info is None or u_info is None:
            if o_name != u_name:
                self.add("FIELD_NAMED_TYPE_CHANGED", path)
            return
        o_local = o_name.removeprefix(f".{o_info.package}." if o_info.package else ".")
        u_local = u_name.removeprefix(f".{u_info.package}." if u_info.package else ".")
        if o_local != u_local:
            self.add("FIELD_NAMED_TYPE_CHANGED", path)
        elif not (o_info.file == self.original.main and u_info.file == self.update.main):
            before = len(self.incompatible)
            self.message(o_info.proto, u_info.proto, f"#/{o_local.replace('.', '/')}",
                         (o_info.syntax, u_info.syntax), key=o_name)
            if len(self.incompatible) > before:
                self.add("FIELD_NAMED_TYPE_CHANGED", path)


def _fields_by_tag(message: Any) -> tuple[dict[int, Any], dict[int, str], dict[str, list[int]]]:
    """(tag -> field, tag -> its real oneof's name, oneof name -> its tags); proto3 ``optional``'s
    synthetic oneofs are not oneofs (Wire has a label for them)."""
    by_tag: dict[int, Any] = {}
    oneof_of: dict[int, str] = {}
    oneofs: dict[str, list[int]] = {}
    for f in message.field:
        by_tag[f.number] = f
        if f.HasField("oneof_index") and not f.proto3_optional:
            name = message.oneof_decl[f.oneof_index].name
            oneof_of[f.number] = name
            oneofs.setdefault(name, []).append(f.number)
    return by_tag, oneof_of, oneofs
