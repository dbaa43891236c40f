"""The client under any aiokafka client, and requests aiokafka's admin client has no call for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer

from pipeline.errors import PipelineError
from pipeline.kafka.requests import MetadataRequest


@dataclass(frozen=True, slots=True)
class ClusterIds:
    """The cluster's id and the id of each topic asked for that exists (a topic deleted and created
    again under its name has a new id)."""

    cluster: str
    topics: dict[str, str]


async def cluster_ids(admin: Any, topics: list[str]) -> ClusterIds:
    """Ask the broker, over an open admin client, for the cluster id and the ids of ``topics``."""
    response: Any = await admin_request(admin, MetadataRequest(topics))
    found = {name: str(topic_id) for error, name, topic_id, *_ in response.topics if error == 0}
    return ClusterIds(str(response.cluster_id or ""), found)


async def admin_request(admin: Any, request: Any) -> Any:
    """Send a request aiokafka's admin client has no call for, as its own calls send theirs."""
    return await admin._send_request(request)


def kafka_client(client: AIOKafkaClient | AIOKafkaProducer | AIOKafkaConsumer | Any) -> AIOKafkaClient:
    """The ``AIOKafkaClient`` (connections, coordinators) of a producer, a consumer or an admin client."""
    if isinstance(client, AIOKafkaClient):
        return client
    if isinstance(client, AIOKafkaProducer):
        return client.client
    found = getattr(client, "_client", None)
    if not isinstance(found, AIOKafkaClient):
        raise PipelineError(f"{type(client).__name__} has no Kafka client")
    return found
