"""A cheaper ``__init__`` for the frozen, slotted dataclasses made once per request.

A frozen dataclass's generated ``__init__`` assigns every field with
``object.__setattr__(self, name, value)`` (the class's own ``__setattr__``
refuses), a global lookup and a generic attribute call per field:
~1.1 us for six fields on the development VM against ~0.5 us for a plain
class. The request path builds several such objects per produce request
(header, frame, produce view, partition, records summary, result, append),
which the acks=0 profile of issue 13 showed as ~10 % of the trio thread's
samples (``__create_fn__.<locals>.__init__``).

``fast_frozen_init`` replaces that ``__init__`` with one that stores each
argument through the field's slot descriptor (``member_descriptor.__set__``),
which is what ``object.__setattr__`` ends up calling, without the lookup
(~0.6 us for six fields). The class stays frozen: assignment after
construction still raises ``FrozenInstanceError``; equality, hashing, repr and
pickling are the dataclass's own.

Only for ``@dataclass(frozen=True, slots=True)`` classes without
``__post_init__``, ``InitVar`` or ``default_factory`` fields (checked).
"""

from __future__ import annotations

import dataclasses
import types
from typing import TypeVar

from pipeline.native import Layout

T = TypeVar("T", bound=type)

_MISSING = dataclasses.MISSING


def _slotted_fields(cls: type, user: str, frozen: bool) -> tuple[dataclasses.Field, ...]:
    """The fields of ``cls``, a slotted dataclass (frozen too if ``frozen``) without
    ``__post_init__`` whose fields are all plain positional ones (no default factory, no
    ``init=False``, no keyword-only); else TypeError naming ``user``."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or (frozen and not params.frozen) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: {user} needs @dataclass({'frozen=True, ' if frozen else ''}slots=True)")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: {user} does not run __post_init__")
    fields = dataclasses.fields(cls)
    for f in fields:
        if f.default_factory is not _MISSING or not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: {user} takes plain positional fields only")
    return fields


def fast_frozen_init(cls: T) -> T:
    """Class decorator (put it above ``@dataclass``): see the module docstring.

    Raises:
        TypeError: ``cls`` is not a frozen slotted dataclass, has a
            ``__post_init__``, or a field with a default factory or ``init=False``.
    """
    namespace: dict[str, object] = {}
    args: list[str] = []
    body: list[str] = []
    for f in _slotted_fields(cls, "fast_frozen_init", frozen=True):
        if f.default is _MISSING:
            args.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        body.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(args)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, namespace)  # noqa: S102 - generated from the dataclass's own field names
    init = namespace["__init__"]
    assert isinstance(init, types.FunctionType)  # the def exec'd above
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__dict__["__init__"].__doc__  # the dataclass's own (slots=True: in this class)
    # mypy refuses any assignment to __init__; replacing it is this decorator's purpose (as dataclass's own)
    cls.__init__ = init  # type: ignore[misc]
    return cls


def layout(cls: type) -> Layout:
    """A C builder of ``cls`` instances (``pipeline._frames.Layout``): called with the first k
    fields positionally, it stores them and the defaults of the rest straight into the slots, as
    ``fast_frozen_init``'s ``__init__`` does, without running Python code (for the objects the
    Processor's read path makes per request, in ``pipeline._frames.cut``).

    Raises:
        TypeError: ``cls`` is not a slotted dataclass with plain positional fields (the same
            checks as ``fast_frozen_init``, frozen or not).
    """
    fields = _slotted_fields(cls, "layout", frozen=False)
    return Layout(cls, tuple(f.name for f in fields), tuple(f.default for f in fields), _MISSING)
