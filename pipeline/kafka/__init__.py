"""Kafka wiring: topic administration, client settings, transactional producers and the key partitioner.

Everything under here talks to the broker except :mod:`pipeline.kafka.partitioner` and
:mod:`pipeline.kafka.record_size`; import each module for what it holds (this package
imports nothing, so the pure logic can use those two without loading aiokafka).
"""
