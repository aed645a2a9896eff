"""``encode_metadata_response`` against kio's encoding of the same response, byte for byte.

For every Metadata version served (0-12): no topics, topics with errors, partitions with and
without a leader, a null name (v12, answers by topic id), names and arrays long enough for
two-byte lengths in the compact encodings, several brokers, a null cluster id; and generated
responses (hypothesis). The reference is what ``metadata_response`` built before it bypassed
kio: one kio entity per broker, topic and partition, written by kio's entity writer.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from pipeline.protocol.apis import METADATA, response_module
from pipeline.protocol.metadata_encoding import encode_metadata_response
from tests.protocol.protocol_helpers import encode_entity, make, ms

VERSIONS = range(13)


def kio_encoding(version, brokers, cluster_id, controller_id, topics) -> bytes:
    m = response_module(METADATA, version)
    body = make(
        m.MetadataResponse,
        throttle_time=ms(0),
        brokers=tuple(make(m.MetadataResponseBroker, node_id=n, host=h, port=p, rack=None) for n, h, p in brokers),
        cluster_id=cluster_id,
        controller_id=controller_id,
        topics=tuple(
            make(m.MetadataResponseTopic, error_code=ErrorCode(error), name=name, topic_id=topic_id, is_internal=False,
                 partitions=tuple(
                     make(m.MetadataResponsePartition, error_code=ErrorCode(p_error), partition_index=index, leader_id=leader,
                          leader_epoch=epoch, replica_nodes=(leader,) if leader >= 0 else (),
                          isr_nodes=(leader,) if leader >= 0 else (), offline_replicas=())
                     for p_error, index, leader, epoch in partitions))
            for error, name, topic_id, partitions in topics),
    )
    return encode_entity(body)


def same(version, brokers, cluster_id, controller_id, topics) -> None:
    assert encode_metadata_response(version, brokers, cluster_id, controller_id, topics) == \
        kio_encoding(version, brokers, cluster_id, controller_id, topics)


BROKERS = [(1, "127.0.0.1", 9092), (2, "broker-2.example", 19093), (3, "b" * 130, 65535)]
TOPIC_ID = uuid.UUID("6b0e7c1e-1d53-4b0e-9a6f-0c2e6a0f3a11")


@pytest.mark.parametrize("version", VERSIONS)
def test_no_topics_one_broker(version: int) -> None:
    same(version, BROKERS[:1], "cluster-id", 1, [])


@pytest.mark.parametrize("version", VERSIONS)
def test_topics_with_errors_leaders_and_none(version: int) -> None:
    topics = [
        (0, "orders", TOPIC_ID, [(0, 0, 1, 0), (0, 1, 2, 7), (5, 2, -1, 3)]),
        (3, "missing", uuid.UUID(int=0), []),
        (17, "bad name!", uuid.UUID(int=0), []),
        (0, "t" * 200, TOPIC_ID, [(0, i, 1 + i % 3, i) for i in range(200)]),  # two-byte compact lengths
    ]
    same(version, BROKERS, "cluster-id", 2, topics)
    same(version, BROKERS, None, -1, topics)


def test_an_answer_by_topic_id_has_a_null_name_in_v12() -> None:
    same(12, BROKERS[:1], "c", 1, [(100, None, TOPIC_ID, [])])


def test_versions_outside_0_to_12_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_metadata_response(13, BROKERS, "c", 1, [])


partitions = st.lists(st.tuples(st.sampled_from([0, 5, 9]), st.integers(0, 2**31 - 1), st.integers(-1, 2**31 - 1),
                                st.integers(-1, 2**31 - 1)), max_size=5)
topics = st.lists(st.tuples(st.sampled_from([0, 3, 17]), st.text(min_size=1, max_size=20),
                            st.uuids(), partitions), max_size=4)
brokers = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.text(min_size=1, max_size=20),
                             st.integers(0, 65535)), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), brokers=brokers, cluster_id=st.none() | st.text(max_size=30),
       controller_id=st.integers(-1, 2**31 - 1), topics=topics)
def test_generated_responses_encode_as_kio_does(version, brokers, cluster_id, controller_id, topics) -> None:
    same(version, brokers, cluster_id, controller_id, topics)
