"""The Attention lens's records for a model with learned sinks (gpt-oss): each head's share of attention to nothing
travels with the grid and the head view, and the selection line names it; a model without sinks says nothing."""
from __future__ import annotations

import numpy as np
import pytest

from app.records.attention import make_attention_record, make_head_record
from app.views.attention.controls import describe_selection
from engine.model import load_model
from engine.observe import attention_maps as amaps
from engine.observe.recorder import Recorder
from tests.engine.models.arch_cases import model_file
from tools.make_arch_models import token_ids

N = 40


@pytest.mark.parametrize("name", ["gpt_oss", "qwen3moe"])
def test_sink_share_reaches_the_records(tmp_path, name: str) -> None:  # noqa: ANN001
    model = load_model(model_file(tmp_path, name, "Q8_0"), numerics="ggml")
    try:
        rec, cache = Recorder(), model.new_cache(64)
        ids = token_ids()[:N]
        rec.begin(0, N)
        model.net.forward(ids, cache, rec)
        cache.commit(ids)
        rec.commit()
        texts = [f"t{i}" for i in range(N)]
        grid = make_attention_record(model, rec, cache, texts, thumb=8)
        head = make_head_record(model, rec, cache, 1, 3, None, texts)
        if name == "qwen3moe":
            assert grid.learned_sink is None and head.sink_share is None
            assert "sink" not in describe_selection(head, None)
            return
        share = amaps.sink_share(rec, cache, 1, np.arange(N))
        assert grid.learned_sink is not None and grid.learned_sink.shape == (2, 8)
        assert np.isclose(grid.learned_sink[1, 3], share[3].mean(), atol=1e-5)
        assert head.sink_share is not None and np.isclose(head.sink_share, share[3].mean(), atol=1e-5)
        assert f"{head.sink_share:.0%} to the learned sink" in describe_selection(head, None)
    finally:
        model.close()
