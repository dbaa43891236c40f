"""The read model: what the pipeline's topics hold, read back for people.

Shared by the operator commands (``pipeline/ops/``) and the console
(``pipeline/console/``), which import it and never each other: DLQ records
(``dlq``: choosing them, rebuilding the original) and a key's history
(``lookup``, with ``key_report`` and ``key_history``).
"""
