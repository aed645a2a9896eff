"""Bounds pre-check of request bodies, before kio's native reader sees them.

kio 0.6.5 decodes with Rust (pyo3) entity readers that size every array
with ``Vec::with_capacity(length)`` straight from the wire. A length of ~2**31
(40 bytes from any client) makes the allocation fail, and Rust's allocation
error handler *aborts the process* (SIGABRT): no exception, no ``except``.
So every body is first walked here, in pure Python, along the same path
kio's reader takes (kio's own schema metadata: dataclass fields with
``metadata["kafka_type"]``, nested entity tuples, ``__flexible__``, tags),
reading only length fields and skipping everything else, without building
objects. A body passes only if every array length fits in the bytes left
(at the element's minimum encoded size, at least 1 byte each), every
string/bytes/records length fits, every varint is at most 5 bytes (as kio
reads them) and tagged-field sections are well formed; after that, kio's
allocations are bounded by the frame size.

What is *not* checked here (kio still rejects it, catchably): UTF-8,
boolean values, error codes, trailing bytes.

A plan is compiled once per request class (:func:`compile_plan`, cached);
checking a one-partition Produce request costs ~1-2 us.

Also: pure-Python readers for the request header
(:func:`read_nullable_legacy_string`, :func:`read_unsigned_varint`), and :func:`is_rust_panic` for pyo3's
``PanicException``, which derives from ``BaseException``.
"""

from __future__ import annotations

import dataclasses
import functools
import struct

from typing import Any
from typing import TypeAlias

from kio.serial._introspect import EntityField
from kio.static.protocol import Entity, Payload
from kio.serial._introspect import EntityTupleField
from kio.serial._introspect import PrimitiveField
from kio.serial._introspect import PrimitiveTupleField
from kio.serial._introspect import classify_field
from kio.serial._introspect import get_field_tag
from kio.serial._introspect import get_schema_field_type
from kio.serial._introspect import is_optional

from .errors import InvalidRequestError

__all__ = (
    "Plan",
    "check_body",
    "compile_plan",
    "is_rust_panic",
    "read_nullable_legacy_string",
    "read_unsigned_varint",
)

# Step opcodes. A step is ``(op, arg, nullable, path)``; ``path`` names the
# field for error messages, e.g. "ProduceRequest.topic_data[].name".
_SKIP = 0  # arg: fixed byte count (merged runs of fixed-size fields)
_COMPACT = 1  # compact string/bytes/records: uvarint length+1, 0 = null
_COMPACT_ARRAY = 2  # arg: (element plan, element min size); uvarint n+1, 0 = null
_TAGS = 3  # arg: {tag: plan}; tagged-field section of a flexible entity
_INT16_STRING = 4  # legacy string: int16 length, -1 = null
_INT32_BYTES = 5  # legacy bytes/records: int32 length, -1 = null
_INT32_ARRAY = 6  # arg: (element plan, element min size); int32 n, -1 = null
_STRUCT = 7  # arg: entity plan; nullable: int8 marker first (-1 = null, KIP-893)

Step: TypeAlias = tuple[int, Any, bool, str]
Plan: TypeAlias = tuple[Step, ...]

# Encoded size of kio's fixed-size kafka types (kio.serial._serialize.get_writer).
_FIXED_SIZES: dict[str, int] = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_VARIABLE_TYPES = frozenset({"string", "bytes", "records"})
# Minimum encoded size of the length-prefixed steps (the null/empty encoding).
_MIN_SIZES = {
    _COMPACT: 1,
    _COMPACT_ARRAY: 1,
    _TAGS: 1,
    _INT16_STRING: 2,
    _INT32_BYTES: 4,
    _INT32_ARRAY: 4,
}

_unpack_int8 = struct.Struct(">b").unpack_from
_unpack_int16 = struct.Struct(">h").unpack_from
_unpack_int32 = struct.Struct(">i").unpack_from
_MAX_UVARINT_BYTES = 5  # kio's internal_read_unsigned_varint limit


# ------------------------------------------------------------------ compile


@functools.cache
def compile_plan(entity_type: type[Entity] | type[Payload]) -> Plan:
    """The check plan for kio entity class ``entity_type`` (a request class).

    Mirrors kio's native ``compile_entity_schema``/``build_field_schema``:
    field encodings follow the *containing* entity's ``__flexible__``;
    tagged primitive fields are never nullable; optional entity fields
    carry a null marker. Cached per class.

    :raises NotImplementedError: a kafka type this module does not know
        (a newer kio); raised at import of :mod:`.apis`, never per request.
    """
    return _entity_steps(entity_type, entity_type.__name__)


def _entity_steps(entity_type: type[Entity] | type[Payload], path: str) -> Plan:
    flexible: bool = entity_type.__flexible__
    steps: list[Step] = []
    tags: dict[int, Plan] = {}
    for field in dataclasses.fields(entity_type):
        tag = get_field_tag(field)
        field_path = f"{path}.{field.name}"
        field_steps = _field_steps(field, flexible, tag is not None, field_path)
        if tag is None:
            steps.extend(field_steps)
        else:
            tags[int(tag)] = _merge(field_steps)
    if flexible:
        steps.append((_TAGS, tags, False, f"{path} tagged fields"))
    elif tags:  # pragma: no cover - kio refuses such schemas too
        raise NotImplementedError(f"{path}: tagged fields on a non-flexible entity")
    return _merge(steps)


def _field_steps(field: dataclasses.Field, flexible: bool, is_tag: bool, path: str) -> list[Step]:
    kind = classify_field(field)
    if isinstance(kind, PrimitiveField):
        nullable = is_optional(field) and not is_tag
        return [_primitive_step(get_schema_field_type(field), flexible, nullable, path)]
    if isinstance(kind, EntityField):
        return [(_STRUCT, _entity_steps(kind.type_, path), is_optional(field), path)]
    if isinstance(kind, PrimitiveTupleField):
        kafka_type = get_schema_field_type(field)
        element: Plan = (_primitive_step(kafka_type, flexible, False, f"{path}[]"),)
    elif isinstance(kind, EntityTupleField):
        element = _entity_steps(kind.type_, f"{path}[]")
    else:  # pragma: no cover - classify_field returns one of the four
        raise NotImplementedError(f"{path}: unknown field classification {kind!r}")
    op = _COMPACT_ARRAY if flexible else _INT32_ARRAY
    # Kafka (and Kafka's generated readers) reject a null non-nullable array;
    # kio would hand back None, which callers do not expect.
    return [(op, (element, max(_min_size(element), 1)), is_optional(field), path)]


def _primitive_step(kafka_type: str, flexible: bool, nullable: bool, path: str) -> Step:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return (_SKIP, size, False, path)
    if kafka_type not in _VARIABLE_TYPES:
        raise NotImplementedError(f"{path}: kafka type {kafka_type!r} is not known to the guard")
    if flexible:
        return (_COMPACT, None, nullable, path)
    return (_INT16_STRING if kafka_type == "string" else _INT32_BYTES, None, nullable, path)


def _merge(steps: list[Step]) -> Plan:
    """Merge runs of fixed-size steps into one skip (named by the first)."""
    merged: list[Step] = []
    for step in steps:
        if step[0] == _SKIP and merged and merged[-1][0] == _SKIP:
            previous = merged[-1]
            merged[-1] = (_SKIP, previous[1] + step[1], False, previous[3])
        else:
            merged.append(step)
    return tuple(merged)


def _min_size(plan: Plan) -> int:
    total = 0
    for op, arg, nullable, _ in plan:
        if op == _SKIP:
            total += arg
        elif op == _STRUCT:
            total += 1 if nullable else _min_size(arg)
        else:
            total += _MIN_SIZES[op]
    return total


# -------------------------------------------------------------------- check


def check_body(plan: Plan, buffer: bytes | memoryview, offset: int) -> int:
    """Walk the body at ``buffer[offset:]`` along ``plan``; return where it ends.

    ``buffer`` must index to ints (``bytes`` or a ``"B"`` memoryview). Bytes
    after the body are not an error here (the caller checks trailing bytes
    after kio has parsed).

    :raises InvalidRequestError: a length that does not fit in the bytes
        left, a null where the schema forbids one, a truncated fixed-size
        field, an over-long varint, or an unknown tag; the message names
        the field, the value and the bytes remaining.
    """
    return _walk(plan, buffer, offset, len(buffer))


def _walk(plan: Plan, buffer: Any, pos: int, end: int) -> int:  # noqa: C901 - one loop on purpose
    # Hot path: Produce v9+ is SKIP/COMPACT/COMPACT_ARRAY/TAGS, tested first;
    # one-byte varints are read inline.
    for op, arg, nullable, path in plan:
        if op == _SKIP:
            pos += arg
            if pos > end:
                raise _truncated(path, arg, pos - arg, end)
        elif op == _COMPACT or op == _COMPACT_ARRAY:
            if pos < end and buffer[pos] < 0x80:
                length = buffer[pos]
                pos += 1
            else:
                length, pos = _uvarint(buffer, pos, end, path)
            if length == 0:
                if not nullable:
                    raise InvalidRequestError(
                        f"{path}: null (length 0) at byte {pos - 1}, but the field is not nullable"
                    )
                continue
            length -= 1
            if op == _COMPACT:
                if length > end - pos:
                    raise _too_long(path, "compact string/bytes length", length, pos, end)
                pos += length
            else:
                pos = _array(arg, length, buffer, pos, end, path, "compact array length")
        elif op == _TAGS:
            if pos < end and buffer[pos] == 0:  # no tagged fields, the usual case
                pos += 1
                continue
            pos = _tagged_fields(arg, buffer, pos, end, path)
        elif op == _INT16_STRING:
            if pos + 2 > end:
                raise _truncated(path, 2, pos, end)
            length = _unpack_int16(buffer, pos)[0]
            pos += 2
            if length < 0:
                _check_null(length, nullable, path, "string length", pos - 2)
                continue
            if length > end - pos:
                raise _too_long(path, "string length", length, pos, end)
            pos += length
        elif op == _INT32_BYTES or op == _INT32_ARRAY:
            if pos + 4 > end:
                raise _truncated(path, 4, pos, end)
            length = _unpack_int32(buffer, pos)[0]
            pos += 4
            if length < 0:
                _check_null(length, nullable, path, "length", pos - 4)
                continue
            if op == _INT32_BYTES:
                if length > end - pos:
                    raise _too_long(path, "bytes length", length, pos, end)
                pos += length
            else:
                pos = _array(arg, length, buffer, pos, end, path, "array length")
        else:  # _STRUCT
            if nullable:
                if pos >= end:
                    raise _truncated(path, 1, pos, end)
                pos += 1
                if _unpack_int8(buffer, pos - 1)[0] == -1:  # kio: any other marker means present
                    continue
            pos = _walk(arg, buffer, pos, end)
    return pos


def _array(
    arg: tuple[Plan, int], length: int, buffer: Any, pos: int, end: int, path: str, what: str
) -> int:
    element, min_size = arg
    if length * min_size > end - pos:
        raise InvalidRequestError(
            f"{path}: {what} {length} does not fit in the {end - pos} bytes remaining "
            f"at byte {pos} (each element takes at least {min_size} bytes)"
        )
    if len(element) == 1 and element[0][0] == _SKIP:  # array of fixed-size primitives
        return pos + length * element[0][1]
    for _ in range(length):
        pos = _walk(element, buffer, pos, end)
    return pos


def _tagged_fields(tags: dict[int, Plan], buffer: Any, pos: int, end: int, path: str) -> int:
    """A tagged-field section, the way kio's ``parse_entity`` reads it: for
    each field, tag and size varints, then the field *by its schema* (kio
    does not use the size), and unknown tags are errors (``KeyError`` in kio)."""
    count, pos = _uvarint(buffer, pos, end, path)
    if count * 2 > end - pos:  # tag and size varints take a byte each at least
        raise InvalidRequestError(
            f"{path}: {count} tagged fields do not fit in the {end - pos} bytes remaining "
            f"at byte {pos}"
        )
    for _ in range(count):
        tag, pos = _uvarint(buffer, pos, end, path)
        size, pos = _uvarint(buffer, pos, end, f"{path} (tag {tag})")
        if size > end - pos:
            raise _too_long(f"{path} (tag {tag})", "tagged field size", size, pos, end)
        plan = tags.get(tag)
        if plan is None:
            raise InvalidRequestError(f"{path}: unknown tagged field tag {tag} at byte {pos}")
        pos = _walk(plan, buffer, pos, end)
    return pos


def _uvarint(buffer: Any, pos: int, end: int, path: str) -> tuple[int, int]:
    """Unsigned varint at ``pos`` as kio reads it: at most 5 bytes (so up to
    2**35 - 1). Returns ``(value, position after it)``."""
    value = 0
    shift = 0
    start = pos
    while True:
        if pos - start == _MAX_UVARINT_BYTES:
            raise InvalidRequestError(
                f"{path}: varint at byte {start} is longer than {_MAX_UVARINT_BYTES} bytes"
            )
        if pos >= end:
            raise InvalidRequestError(
                f"{path}: varint at byte {start} is truncated by the frame end"
            )
        byte = buffer[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _check_null(length: int, nullable: bool, path: str, what: str, at: int) -> None:
    if length == -1 and nullable:
        return
    reason = "the field is not nullable" if length == -1 else "negative"
    raise InvalidRequestError(f"{path}: {what} {length} at byte {at}: {reason}")


def _too_long(path: str, what: str, length: int, pos: int, end: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"{path}: {what} {length} exceeds the {end - pos} bytes remaining at byte {pos}"
    )


def _truncated(path: str, size: int, pos: int, end: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"{path}: {size}-byte fixed-size field(s) at byte {pos} run past the frame end "
        f"({end - pos} bytes remaining)"
    )


# ------------------------------------------------------- header and panics


def read_unsigned_varint(buffer: bytes | memoryview, offset: int) -> tuple[int, int]:
    """``(value, size)`` of the unsigned varint at ``offset`` (at most 5 bytes).

    A pure-Python stand-in for kio's reader of the same name, for the
    request header: nothing native runs before the header is trusted.

    :raises ValueError: truncated or longer than 5 bytes.
    """
    try:
        value, end = _uvarint(buffer, offset, len(buffer), "varint")
    except InvalidRequestError as exc:
        raise ValueError(str(exc)) from None
    return value, end - offset


def read_nullable_legacy_string(
    buffer: bytes | memoryview, offset: int
) -> tuple[str | None, int]:
    """``(string or None, size)`` of the int16-length string at ``offset``.

    Pure-Python stand-in for kio's reader, for the request header's client id.

    :raises ValueError: truncated, a negative length other than -1, or not
        UTF-8 (``UnicodeDecodeError`` is a ``ValueError``).
    """
    end = len(buffer)
    if offset + 2 > end:
        raise ValueError(f"string length at byte {offset} is truncated by the frame end")
    length = _unpack_int16(buffer, offset)[0]
    if length == -1:
        return None, 2
    if length < 0:
        raise ValueError(f"negative string length {length} at byte {offset}")
    start = offset + 2
    if length > end - start:
        raise ValueError(
            f"string length {length} exceeds the {end - start} bytes remaining at byte {start}"
        )
    return str(buffer[start : start + length], "utf-8"), 2 + length


def is_rust_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is pyo3's ``PanicException`` (a Rust panic in kio).

    It derives from ``BaseException`` so that ``except Exception`` does not
    swallow it, and pyo3 offers no importable class (its module,
    ``pyo3_runtime``, is not in ``sys.modules``), hence the name check.
    """
    return any(cls.__name__ == "PanicException" for cls in type(exc).__mro__)
