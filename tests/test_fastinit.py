"""fast_frozen_init: same objects as the dataclass's own __init__, still frozen."""

import dataclasses
import pickle

import pytest

from pipeline.fastinit import fast_frozen_init
from pipeline.log.batch import PartitionAppend
from pipeline.protocol.apis import PartitionResult


@fast_frozen_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 7
    label: str | None = None


def test_positional_keyword_and_defaults() -> None:
    assert _Point(1) == _Point(x=1, y=7, label=None)
    assert _Point(1, 2, "a") == _Point(label="a", y=2, x=1)
    assert repr(_Point(1)) == "_Point(x=1, y=7, label=None)"
    with pytest.raises(TypeError):
        _Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Point(1, z=3)  # type: ignore[call-arg]


def test_still_frozen_hashable_and_picklable() -> None:
    p = _Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    assert hash(p) == hash(_Point(1, 2))
    a = PartitionAppend("t", 0, 5, b"xyz", 1, 123)
    assert pickle.loads(pickle.dumps(a)) == a
    assert PartitionResult("t", 1, 0).base_offset == -1


def test_refuses_what_it_cannot_build() -> None:
    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    with pytest.raises(TypeError):
        fast_frozen_init(NotFrozen)

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithFactory:
        x: list = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError):
        fast_frozen_init(WithFactory)
