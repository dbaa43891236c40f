"""What the benches share (``bench/worker_bench.py``, ``scaling.py``, ``hotpath.py``, ``crc_cost.py``,
``alternatives/run.py``):

- :mod:`bench.lib.workload`: the webhook workload, one generator for every bench;
- :mod:`bench.lib.broker`: the broker helper (topics, backlog, reading back);
- :mod:`bench.lib.topology_file`: the one ``write_topology``;
- :mod:`bench.lib.procs`: contender processes and the one ``free_port``;
- :mod:`bench.lib.phases`: the drain and latency phases;
- :mod:`bench.lib.report`: progress lines, the machine, /proc readings, Markdown tables;
- :mod:`bench.lib.worker_runs`: the worker bench's contenders (``bench/worker_bench.py``, ``bench/scaling.py``).

A script under ``bench/`` puts the checkout's root on ``sys.path`` and imports ``bench.lib``.
"""
