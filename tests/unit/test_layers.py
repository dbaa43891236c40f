"""The architecture's rules that an import can break: the pure logic loads no Kafka, no RocksDB, no HTTP."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Modules of pure logic: the record contract, key extraction, the dedupe decision, sizes and names.
PURE = (
    "pipeline.contract",
    "pipeline.dead_letter",
    "pipeline.headers",
    "pipeline.topology",
    "pipeline.state.decision",
    "pipeline.kafka.partitioner",
    "pipeline.kafka.record_size",
    "pipeline.providers.generic",
)
IO_LIBRARIES = ("aiokafka", "rocksdict", "aiohttp")


@pytest.mark.parametrize("module", PURE)
def test_pure_logic_imports_no_io_library(module: str) -> None:
    """Importing ``module`` in a fresh interpreter loads none of aiokafka, rocksdict and aiohttp."""
    code = f"import sys, {module}; print(','.join(m for m in {IO_LIBRARIES!r} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "", f"{module} loads {loaded.strip()}"
