"""OffsetSequencer: offsets per partition, no I/O."""

import pytest

from pipeline.log.sequencing import OffsetSequencer


def test_offsets_are_contiguous_per_partition():
    offsets = OffsetSequencer()
    assert offsets.assign("t", 0, 3) == 0
    assert offsets.assign("t", 1, 2) == 0
    assert offsets.assign("t", 0, 1) == 3
    assert offsets.log_end_offset("t", 0) == 4
    offsets.restore("u", 0, 42)
    assert offsets.assign("u", 0, 1) == 42
    with pytest.raises(ValueError):
        offsets.assign("t", 0, 0)
