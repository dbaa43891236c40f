"""Kafka settings the pipeline's topics and clients share."""

from __future__ import annotations

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"  # the broker ``pipeline up`` starts, and every command's default

# Largest record any pipeline topic takes. A command embeds the webhook body and a DLQ record
# carries it twice (text and base64), so a 1 MiB body (the ingress limit) needs well over the
# broker's 1 MiB default.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# How long a tool's read of a whole topic (``dlq list``, ``dlq replay``, the console's DLQ pages)
# waits, by default, with no partition moving before it gives up and says how far it got.
READ_TIMEOUT_S = 60.0
