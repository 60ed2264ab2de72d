"""One SmolLM2 model for the observe tests that run it (loading it is most of their time)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path: Path):
    from engine.model import load_model

    model = load_model(smollm2_path)
    yield model
    model.close()
