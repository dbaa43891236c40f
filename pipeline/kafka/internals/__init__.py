"""The one door to aiokafka's private parts: every use of a name aiokafka does not publish.

One module per part of aiokafka reached into (:mod:`.producer`, :mod:`.consumer`, :mod:`.fetch`,
:mod:`.client`, :mod:`.group_offsets`); callers import from here. Each of these relies on how aiokafka 0.14 works inside, and each has a test in
``tests/unit/kafka/test_internals.py`` that fails if that changes (the project pins
aiokafka below 0.15). Nothing else in ``pipeline/`` touches a private aiokafka name;
ruff's private-member rule keeps it that way.

- :func:`shorten_concurrent_transactions_wait`: the module-level wait of aiokafka's
  sender before it asks again to add a partition to a transaction.
- :func:`sender_failure`: why a producer's background sender stopped (a producer whose
  sender stopped can send nothing more: aiokafka's transaction state machine then
  answers ``begin`` and ``abort`` with ``AssertionError``, which :data:`DEAD_PRODUCER_ERRORS`
  names for the callers that must catch it).
- :func:`abort_would_be_local`: whether aiokafka forgot what its open transaction
  holds (it does after an authorization error) and would "abort" it without telling
  the broker, which would then commit those records with the next transaction.
- :func:`stop_consumer`: stop a consumer whose fetcher lets a ``CancelledError`` out.
- :func:`request_rejoin`: make the group consumer rejoin its group at once.
- :func:`read_committed_before_start`: make a consumer faust's driver made read committed records only.
- :func:`generation_current`: ask the group coordinator whether this consumer is
  still a member of its current generation (a Heartbeat of its own), before a
  producer start that would fence whoever the group assigns the partition to now.
- :func:`fetch_raw`: one raw fetch of a partition through a consumer's connections,
  the records left undecoded (the restore's fast path).
- :func:`log_end`: a partition's log end (its high watermark) through a read_committed
  consumer's connections, which aiokafka's ``end_offsets`` gives only as the last stable
  offset: a new owner restores until the transactions open there have ended.
- :func:`batch_builder`: a record batch capped at a topic's own size limit.
- :func:`admin_request` and :func:`cluster_ids`: requests aiokafka's admin client has no
  call for, among them Metadata v12 (:mod:`pipeline.kafka.requests`) for the cluster id and
  the topic ids, which aiokafka's own request (v5 at most) does not carry.
- :func:`group_metadata` and :func:`send_offsets_with_group_metadata` (eos-v2, KIP-447): a
  transaction's offsets sent as TxnOffsetCommit v3 with the consumer's generation, member id
  and group instance id, through one producer's own sender (aiokafka sends v0, which the
  group coordinator cannot check); a refusal leaves the transaction abortable on the broker.
- :func:`group_request` and :func:`group_coordinator_moved`: a request of our own to a
  consumer's group coordinator (OffsetFetch v7 with ``require_stable``:
  :mod:`pipeline.kafka.stable_offsets`).
- :func:`know_fenced_instance_id` and :func:`fenced_instance`: FENCED_INSTANCE_ID (KIP-345) added
  to aiokafka's error table, which lacks it, and found again in the ``KafkaError`` its group
  coordinator wraps it in (two workers with one ``--instance-id``).
- :func:`know_invalid_record`: INVALID_RECORD (KIP-467) added to aiokafka's error table, so that a
  record the broker refuses as invalid (a keyless record on a compacted topic) is named and
  isolated like the other refusals a record causes (:mod:`pipeline.worker.poison`).
- :func:`kafka_client`: the ``AIOKafkaClient`` under a consumer or an admin client (fencing a
  transactional id without a producer: :mod:`pipeline.kafka.fencing`).
"""

from pipeline.kafka.internals.client import ClusterIds, admin_request, cluster_ids, kafka_client
from pipeline.kafka.internals.consumer import (
    FencedInstanceIdError,
    fenced_instance,
    generation_current,
    group_coordinator_moved,
    group_metadata,
    group_request,
    know_fenced_instance_id,
    read_committed_before_start,
    request_rejoin,
    stop_consumer,
)
from pipeline.kafka.internals.fetch import RawFetch, fetch_raw, force_metadata_update, log_end
from pipeline.kafka.internals.group_offsets import send_offsets_with_group_metadata
from pipeline.kafka.internals.producer import (
    DEAD_PRODUCER_ERRORS,
    InvalidRecordError,
    abort_would_be_local,
    batch_builder,
    know_invalid_record,
    sender_dead,
    sender_failure,
    sender_task,
    shorten_concurrent_transactions_wait,
)

__all__ = [
    "DEAD_PRODUCER_ERRORS",
    "ClusterIds",
    "FencedInstanceIdError",
    "InvalidRecordError",
    "RawFetch",
    "abort_would_be_local",
    "admin_request",
    "batch_builder",
    "cluster_ids",
    "fenced_instance",
    "fetch_raw",
    "force_metadata_update",
    "generation_current",
    "group_coordinator_moved",
    "group_metadata",
    "group_request",
    "kafka_client",
    "know_fenced_instance_id",
    "know_invalid_record",
    "log_end",
    "read_committed_before_start",
    "request_rejoin",
    "send_offsets_with_group_metadata",
    "sender_dead",
    "sender_failure",
    "sender_task",
    "shorten_concurrent_transactions_wait",
    "stop_consumer",
]
