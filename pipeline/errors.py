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


class BrokerUnavailableError(PipelineError):
    """The Kafka broker cannot be reached or did not answer in time."""

    retriable = True
    reason = "broker-unavailable"


class StoreError(PipelineError):
    """The local state store failed."""

    reason = "store"


class StoreCorruptError(StoreError):
    """The local state store cannot be read; it is wiped and restored from the changelog."""

    reason = "store-corrupt"


class PartitionFencedError(PipelineError):
    """Another producer took over this partition's transactional id; drop the partition."""

    reason = "fenced"
