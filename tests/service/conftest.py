"""Service fixtures; the helpers they use live in tests/service/helpers.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.http.app import create_app
from service.inference.engine import Engine
from tests.service.helpers import FakeModel, fast_settings, running


@pytest.fixture(scope="session")
def eos_engine(eos_bundle: Path) -> Engine:
    """The real engine on the tiny bundle whose searches stop at varied lengths."""
    return Engine.load(eos_bundle, device="cpu", intra_op_threads=1)


@pytest.fixture
def fake() -> FakeModel:
    return FakeModel()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(fake: FakeModel) -> AsyncIterator[httpx.AsyncClient]:
    """The app over the fake model with the test settings, lifespan running."""
    async with running(create_app(fast_settings(), models=[fake])) as client:
        yield client


@pytest.fixture(scope="session")
def shipped_engine(shipped_bundle: Path) -> Engine:
    """The shipped en->de model's engine (the documents' placement tests)."""
    return Engine.load(shipped_bundle, device="cpu", intra_op_threads=1)
