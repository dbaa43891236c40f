"""The test suite's ``unique`` names: which topics a test's cleanup takes as its own."""

from __future__ import annotations

import pytest

from tests.conftest import Unique

MINE = Unique("a1b2c3d4e5")


@pytest.mark.parametrize(
    "name",
    [
        "app-a1b2c3d4e5",
        "app-a1b2c3d4e5.raw",
        "app-a1b2c3d4e5-seen-changelog",
        "in-a1b2c3d4e5_2",
        MINE("orders"),
    ],
)
def test_names_made_with_the_token_are_this_tests(name: str) -> None:
    """A prefix, ``-<token>``, then nothing or a suffix after a separator: deleted after the test."""
    assert MINE.made(name)


@pytest.mark.parametrize(
    "name",
    ["webhooks.raw", "a1b2c3d4e5", "-a1b2c3d4e5", "app-a1b2c3d4e5ff", "app-a1b2c3d4e", "app-f0f0f0f0f0.raw"],
)
def test_other_names_are_left_alone(name: str) -> None:
    """No prefix, a longer or shorter token, or another test's token: never deleted by this test."""
    assert not MINE.made(name)
