"""One cross-attention cell taken apart equals its parts recomputed: the softmax of q·Kᵀ is the weights the model
used (to float32 rounding in float32 numerics; ggml's F16 rounding of K and V in ggml numerics), the weights are the
cell's row of the cross map, and the output is the weighted sum of the values."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.model import load_model
from engine.observe.t5_cell import cross_cell
from engine.observe.t5_maps import attention_maps
from tools.make_t5_model import write_t5


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_t5(tmp_path_factory.mktemp("t5cell") / "t5.gguf", "t5")


@pytest.mark.parametrize("numerics", ["float32", "ggml"])
def test_a_cross_cell_is_its_maps_row(t5: Path, numerics: str) -> None:
    model = load_model(t5, numerics=numerics)
    try:
        enc, dec = [5, 17, 300, 41, 9, 2], [model.net.decoder_start_token, 33, 70, 12]
        maps = attention_maps(model.net, enc, dec)
        cell = cross_cell(model.net, enc, dec, 1, 2, 3)
        assert cell.q.shape == (model.args.head_dim,) and cell.keys.shape == (len(enc), model.args.head_dim)
        assert np.array_equal(cell.weights, maps.cross[1][2, 3])
        s = cell.scores.astype(np.float64)
        soft = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        assert np.allclose(soft, cell.weights, atol=2e-3 if numerics == "ggml" else 1e-5)
        assert np.allclose(cell.out, cell.weights @ cell.values, atol=1e-5)
        with pytest.raises(ValueError, match="output position 4 out of range"):
            cross_cell(model.net, enc, dec, 0, 0, 4)
    finally:
        model.close()
