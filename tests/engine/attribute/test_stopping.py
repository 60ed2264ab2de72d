"""Stopping a gradient attribution within its passes: integrated gradients asks `cancel` before each step and counts
its steps with `progress`; attribution patching counts its gradient and each real-patching run, and stops between
them. A stopped run raises AttributionCancelled (a LensError) and leaves the model as it was; the callbacks change no
number."""
from __future__ import annotations

import numpy as np
import pytest

from engine.attribute.api import attribute
from engine.attribute.attribution_patching import attribution_patching
from engine.attribute.inputs import AttributionCancelled, integrated_gradients
from engine.errors import LensError
from engine.intervene.hooks import run_with_hooks
from engine.model import load_model
from tests.tiny_models import make_tiny_llama

IDS = [5, 17, 3, 40, 9, 23, 11, 30]
CORRUPT = [5, 17, 8, 40, 9, 6, 11, 30]  # two tokens changed
TARGET, CONTRAST = 7, 12
STEPS = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    m = load_model(make_tiny_llama(tmp_path_factory.mktemp("stopping") / "tiny.gguf"), numerics="float32", warm=False)
    yield m
    m.close()


class StopAfter:
    """progress and cancel of one run: records each progress call, says stop once `n` passes are reported done."""

    def __init__(self, n: int | None = None) -> None:
        self.n, self.calls = n, []

    def progress(self, done: int, total: int) -> None:
        self.calls.append((done, total))

    def cancel(self) -> bool:
        return self.n is not None and bool(self.calls) and self.calls[-1][0] >= self.n


def test_integrated_gradients_counts_its_steps_and_stops_between_them(tiny) -> None:  # noqa: ANN001
    plain = integrated_gradients(tiny, IDS, TARGET, CONTRAST, steps=STEPS)
    watched = StopAfter()
    full = integrated_gradients(tiny, IDS, TARGET, CONTRAST, steps=STEPS, cancel=watched.cancel,
                                progress=watched.progress)
    assert watched.calls == [(k, STEPS) for k in range(1, STEPS + 1)]
    np.testing.assert_array_equal(full.values, plain.values)  # the callbacks change no number

    before = run_with_hooks(tiny, IDS, [])[-1]
    stop = StopAfter(3)
    with pytest.raises(AttributionCancelled, match="stopped") as got:
        integrated_gradients(tiny, IDS, TARGET, CONTRAST, steps=STEPS, cancel=stop.cancel, progress=stop.progress)
    assert isinstance(got.value, LensError)
    assert stop.calls == [(1, STEPS), (2, STEPS), (3, STEPS)]  # three backward passes of eight, then it stopped
    np.testing.assert_array_equal(run_with_hooks(tiny, IDS, [])[-1], before)
    assert tiny.net.hooks == {}


def test_attribution_patching_counts_its_runs_and_stops_between_them(tiny) -> None:  # noqa: ANN001
    plain = attribution_patching(tiny, IDS, CORRUPT, TARGET, CONTRAST)
    n_heads = tiny.args.n_layers * tiny.args.n_heads  # the real check: one patched run per head
    watched = StopAfter()
    full = attribution_patching(tiny, IDS, CORRUPT, TARGET, CONTRAST, cancel=watched.cancel,
                                progress=watched.progress)
    total = 1 + n_heads  # the gradient, then each run
    assert watched.calls == [(k, total) for k in range(1, total + 1)]
    np.testing.assert_array_equal(full.heads, plain.heads)
    np.testing.assert_array_equal(full.checks["heads"].real, plain.checks["heads"].real)
    assert full.checks["heads"].spearman == plain.checks["heads"].spearman

    stop = StopAfter(3)  # the gradient and two runs
    with pytest.raises(AttributionCancelled):
        attribution_patching(tiny, IDS, CORRUPT, TARGET, CONTRAST, cancel=stop.cancel, progress=stop.progress)
    assert stop.calls == [(1, total), (2, total), (3, total)] and 3 < total
    assert tiny.net.hooks == {}

    with pytest.raises(AttributionCancelled):  # stopped before its gradient: no pass reported
        attribution_patching(tiny, IDS, CORRUPT, TARGET, CONTRAST, cancel=lambda: True, progress=stop.progress)
    assert len(stop.calls) == 3


def test_attribute_hands_cancel_and_progress_to_its_method(tiny) -> None:  # noqa: ANN001
    watched = StopAfter()
    a = attribute(tiny, IDS, f"#{TARGET}", f"#{CONTRAST}", method="ig", steps=4, cancel=watched.cancel,
                  progress=watched.progress)
    assert a.inputs is not None and watched.calls == [(k, 4) for k in range(1, 5)]
    stop = StopAfter(1)
    with pytest.raises(AttributionCancelled):
        attribute(tiny, IDS, f"#{TARGET}", f"#{CONTRAST}", method="patching", corrupt=CORRUPT, cancel=stop.cancel,
                  progress=stop.progress)
    assert stop.calls == [(1, 1 + tiny.args.n_layers * tiny.args.n_heads)]  # the gradient, no run
