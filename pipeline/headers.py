"""Every record header name the pipeline writes or reads, in one place.

Input records (written by the ingress, ``pipeline produce`` or any producer):
``source``, ``received-at``, ``idempotency-key``, and the original HTTP request's
headers under ``http-<name>``. Written by the worker: ``rerouted-from`` on a
record moved to the partition that owns its key, ``original-timestamp`` on an
output stamped with the time it was written, and ``effect-ttl-ms`` and
``command-topic`` on effects-topic records. Written by ``pipeline dlq replay``:
``replayed-from``.
"""

from __future__ import annotations

from typing import Final

HTTP_PREFIX: Final = "http-"  # a request header ``X`` travels as ``http-x``
SOURCE_HEADER: Final = "source"
RECEIVED_AT_HEADER: Final = "received-at"
IDEMPOTENCY_KEY_HEADER: Final = "idempotency-key"
REROUTED_FROM_HEADER: Final = "rerouted-from"  # "<partition>:<offset>" of the record moved
#: On an output record stamped with the time it was written because its topic would have refused
#: the input's own timestamp (too far ahead or behind): that timestamp, in ms.
ORIGINAL_TIMESTAMP_HEADER: Final = "original-timestamp"
REPLAYED_FROM_HEADER: Final = "replayed-from"  # "<dlq topic>:<partition>:<offset>" of a redriven record
EFFECT_TTL_HEADER: Final = "effect-ttl-ms"  # an effects-topic record's effect TTL
COMMAND_TOPIC_HEADER: Final = "command-topic"  # where an effects-topic record's command goes
