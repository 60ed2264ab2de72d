"""gguf-lens serve (being written this session)."""
from __future__ import annotations

import argparse
from typing import Any, Callable


def add_command(sub: Any, add_model: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register the `serve` sub-command."""
