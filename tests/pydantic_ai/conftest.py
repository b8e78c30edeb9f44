"""Fixtures of the Pydantic AI tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pydantic_ai.kit import SharedMcp


@pytest.fixture(scope="module")
def shared_mcp(tmp_path_factory) -> Iterator[SharedMcp]:
    """One MCP HTTP server per test module (kit.SharedMcp: each test asks it for `fresh()`)."""
    server = SharedMcp(tmp_path_factory.mktemp("mcp"))
    yield server
    server.stop()
