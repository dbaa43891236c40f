"""IncrementalAlterConfigs (KIP-339): set some topic configs and leave every other one alone.

aiokafka's admin client only has the legacy AlterConfigs call, which replaces a
topic's whole set of dynamic configs: every key the request does not name goes
back to the broker default (an operator's ``retention.ms`` is lost on each
rerun). aiokafka ships the protocol machinery but not this request, so it is
declared here, version 0 (Kafka 2.3 and later), and sent like aiokafka's own
admin requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResourceType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int8, Int16, Int32, Schema, String

from pipeline.errors import PipelineError
from pipeline.kafka.internals import admin_request

API_KEY = 44
OP_SET = 0  # the other operations: 1 DELETE, 2 APPEND, 3 SUBTRACT


class _ResponseV0(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = API_KEY
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "responses",
            Array(
                ("error_code", Int16),
                ("error_message", String("utf-8")),
                ("resource_type", Int8),
                ("resource_name", String("utf-8")),
            ),
        ),
    )


class _RequestV0(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = API_KEY
    API_VERSION = 0
    RESPONSE_TYPE = _ResponseV0
    SCHEMA = Schema(
        (
            "resources",
            Array(
                ("resource_type", Int8),
                ("resource_name", String("utf-8")),
                (
                    "configs",
                    Array(
                        ("name", String("utf-8")),
                        ("config_operation", Int8),
                        ("value", String("utf-8")),
                    ),
                ),
            ),
        ),
        ("validate_only", Boolean),
    )


class IncrementalAlterConfigsRequest(Request[_RequestV0]):  # type: ignore[misc]  # aiokafka is untyped
    """Set the given configs of the given topics; nothing else about them changes."""

    API_KEY = API_KEY

    def __init__(self, topics: Mapping[str, Mapping[str, str]]) -> None:
        self._resources = [
            (
                ConfigResourceType.TOPIC.value,
                name,
                [(key, OP_SET, value) for key, value in sorted(configs.items())],
            )
            for name, configs in sorted(topics.items())
        ]

    def build(self, request_struct_class: type[_RequestV0]) -> _RequestV0:
        """The request as the negotiated version's struct."""
        return request_struct_class(self._resources, False)


async def set_topic_configs(admin: AIOKafkaAdminClient, topics: Mapping[str, Mapping[str, str]]) -> None:
    """Set ``topics``' configs with IncrementalAlterConfigs; PipelineError naming a refused topic."""
    if not topics:
        return
    # the public client has no such call: sent as its own calls send theirs (pipeline/kafka/internals/)
    response: Any = await admin_request(admin, IncrementalAlterConfigsRequest(topics))
    refused = [
        f"{name}: error {code} {message or ''}".strip()
        for code, message, _type, name in response.responses
        if code != 0
    ]
    if refused:
        raise PipelineError(f"the broker refused to set topic configs: {'; '.join(refused)}")
