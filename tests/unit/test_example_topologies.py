"""The downstream examples name the commands and topics the shipped topologies emit (issue 14)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipeline import topology

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> ModuleType:
    """Import examples/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def shipped(name: str) -> topology.Topology:
    """A topology of topologies/."""
    return topology.load(ROOT / "topologies" / f"{name}.toml")


def routed_commands(topo: topology.Topology) -> dict[str, set[str]]:
    """Each command name a topology's routes emit, with the topics it goes to."""
    commands: dict[str, set[str]] = {}
    for route in topo.routes:
        if route.command and route.topic:
            commands.setdefault(route.command, set()).add(route.topic)
    return commands


def test_postgres_orders_handles_every_stripe_fulfilment_command() -> None:
    """fulfil-order and close-invoice (not invoice-final) are handled, on shop.orders and shop.invoices."""
    orders = example("postgres_orders")
    topo = shipped("stripe-fulfilment")
    assert routed_commands(topo) == {"fulfil-order": {"shop.orders"}, "close-invoice": {"shop.invoices"}}
    assert set(orders.HANDLERS) == set(routed_commands(topo))
    assert orders.topics_for(topo) == ["shop.invoices", "shop.orders"]


def test_postgres_orders_handles_stripe_events_of_the_default_topology() -> None:
    """With no routes, Stripe events arrive as `handle` commands on webhooks.events, dispatched by event type."""
    orders = example("postgres_orders")
    topo = shipped("default")
    assert routed_commands(topo) == {}
    assert orders.topics_for(topo) == [topo.topics.commands] == ["webhooks.events"]
    for event_type, handler in {
        "checkout.session.completed": orders.fulfil_order,
        "payment_intent.succeeded": orders.fulfil_order,
        "invoice.paid": orders.close_invoice,
        "invoice.voided": orders.close_invoice,
        "invoice.marked_uncollectible": orders.close_invoice,
    }.items():
        command = orders.Command("handle", "stripe:evt_1", "stripe:evt_1", "stripe", event_type, 1, {})
        assert orders.handler_for(command) is handler
    github = orders.Command("handle", "github:1", "github:1", "github", "push", 1, {})
    assert orders.handler_for(github) is None
    assert orders.topics_for(shipped("github")) == []


def test_faust_example_handles_every_github_command() -> None:
    """build (git.pushes) and review (git.pull-requests) are handled; nothing it handles is unrouted."""
    faust_example = example("faust_consumer")
    topo = shipped("github")
    assert routed_commands(topo) == {"build": {"git.pushes"}, "review": {"git.pull-requests"}}
    assert set(faust_example.HANDLERS) == set(routed_commands(topo))
    assert faust_example.topics_for(topo) == ["git.pull-requests", "git.pushes"]


@pytest.mark.parametrize("name", ["postgres_orders", "faust_consumer"])
def test_every_handled_command_is_emitted_by_a_shipped_topology(name: str) -> None:
    """A handler for a command no shipped topology emits (the old invoice-final) is a bug."""
    emitted = {"handle"}
    for topo in ("default", "stripe-fulfilment", "github"):
        emitted |= set(routed_commands(shipped(topo)))
    assert set(example(name).HANDLERS) <= emitted
