"""The pipeline's errors: one root, names ending in ``Error``, each with its retry policy.

``retriable`` says whether the same call may succeed if tried again later
(a broker that is down); ``reason`` is a short stable code used in DLQ records,
metrics labels and HTTP answers.
"""

from __future__ import annotations

from typing import ClassVar


class PipelineError(Exception):
    """Root of every error the pipeline raises on purpose."""

    retriable: ClassVar[bool] = False
    reason: ClassVar[str] = "error"


class ConfigError(PipelineError):
    """A setting or a topology is invalid; nothing starts."""

    reason = "config"


class TopologyError(ConfigError):
    """A topology file has one or more problems, each with file, key and reason."""

    reason = "topology"

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class MissingExtraError(PipelineError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""

    reason = "missing-extra"


class UnknownProviderError(ConfigError):
    """No provider preset has this name."""

    reason = "unknown-provider"


class InvalidRecordError(PipelineError):
    """A record cannot be processed; it goes to the DLQ with ``reason``."""

    reason = "invalid"


class UnknownSourceError(InvalidRecordError):
    """The record's ``source`` header is missing or names no source of the topology."""

    reason = "unknown-source"


class MissingKeyError(InvalidRecordError):
    """No idempotency key can be found for a webhook."""

    reason = "missing-key"


class BodyError(InvalidRecordError):
    """The webhook body cannot be read (not JSON, wrong encoding, too large)."""

    reason = "bad-body"


class SignatureError(InvalidRecordError):
    """A webhook's signature or timestamp failed verification; the message says which check."""

    reason = "bad-signature"


class KeyMismatchError(InvalidRecordError):
    """A worker-verified record's key is not the event id its verified request carries."""

    reason = "key-mismatch"


class InvalidHeaderError(InvalidRecordError):
    """A header the contract defines has a value out of its range (``received-at`` not a sane time)."""

    reason = "bad-header"


class RecordTooLargeError(InvalidRecordError):
    """An output record (command, rerouted copy) is larger than its topic accepts."""

    reason = "too-large"


class BrokerUnavailableError(PipelineError):
    """The Kafka broker cannot be reached or did not answer in time."""

    retriable = True
    reason = "broker-unavailable"


class RestoreIncompleteError(PipelineError):
    """A restore ended short of the changelog end it was to reach: the store lacks claims its
    changelog holds, so its partition is not served; opening it again replays on from the store's
    position."""

    retriable = True
    reason = "restore-incomplete"


class StoreError(PipelineError):
    """The local state store failed."""

    reason = "store"


class StoreLockedError(StoreError):
    """Another process (or a previous owner in this one) still holds the store's lock; wait and retry."""

    retriable = True
    reason = "store-locked"


class StateDirInUseError(StoreError):
    """Another worker of the same group runs on this state directory: refused at start, in one line."""

    reason = "state-dir-in-use"


class StoreCorruptError(StoreError):
    """The local state store cannot be read; it is wiped and restored from the changelog."""

    reason = "store-corrupt"


class StoreStaleError(StoreCorruptError):
    """The store caches another changelog than the partition's (the topics were deleted and created
    again, or the worker points at another cluster), or holds a position beyond its changelog's end:
    it is wiped and rebuilt from the changelog."""

    reason = "store-stale"


class StoreUnusableError(StoreError):
    """The state directory cannot be used (permissions, read-only, disk full, not a directory).

    Retried with backoff for a bounded time (an operator may fix it); never wiped.
    """

    retriable = True
    reason = "store-unusable"


class StoreIdentityError(StoreError):
    """The store on disk belongs to another app, group, topic, partition or changelog; never reused."""

    reason = "store-identity"


class IllegalTransitionError(PipelineError):
    """A partition was asked to move between two lifecycle states that are not connected (a bug)."""

    reason = "illegal-transition"


class PartitionUnservedError(PipelineError):
    """An assigned partition could not be opened within its deadline; the worker exits non-zero."""

    reason = "partition-unserved"


class ProducerFencedError(PipelineError):
    """Another producer took this worker's transactional id (another process with the same id, or the
    broker aborted a transaction open past its timeout): its transaction is aborted; a new producer,
    and the worker rejoins its group."""

    reason = "fenced"


class InstanceIdTakenError(PipelineError):
    """Another worker joined the group with this worker's ``--instance-id``, and the group took it in
    this one's place: two live workers must not share an instance id. The worker exits."""

    reason = "instance-id-taken"


class ProducerUnusableError(PipelineError):
    """A transactional producer cannot continue: close it and start another (which aborts its transaction)."""

    reason = "producer-unusable"


class GroupGenerationFencedError(PipelineError):
    """The group coordinator refused a transaction's offsets: the consumer whose generation, member id
    or group instance id they carry is no longer a member of the group's current generation (KIP-447:
    a zombie). The transaction can only be aborted; the consumer must rejoin before it commits again."""

    reason = "generation-fenced"


class UnstableOffsetsError(PipelineError):
    """A partition's committed offset stayed held by a pending transaction past the deadline: the
    transaction that wrote it neither committed nor aborted in time (ask again later)."""

    retriable = True
    reason = "unstable-offsets"
