"""The Quantization lens decodes i-quant blocks: their fields, byte ranges and weights, from a real GGUF file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.records.tensor import make_tensor_record
from app.views.quant.lens import QuantLens
from engine.gguf.reader import open_gguf
from engine.gguf.writer import write_gguf
from engine.quant import TYPES, GGMLType, dequantize
from engine.quant.blocks import FIELDS
from tests.app.test_lenses_common import synthetic_model_record

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "quant" / "iquants.npz"
IQ_TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]


@pytest.fixture(scope="module")
def iq_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF with one (2, 4 blocks) tensor per i-quant type, of llama.cpp-quantized blocks from the fixture."""
    with np.load(FIXTURE) as f:
        tensors = []
        for name in IQ_TYPES:
            info = TYPES[GGMLType[name]]
            blocks = f[f"blocks_{name}"][:8]
            tensors.append((f"blk.0.{name.lower()}.weight", info.qtype, (4 * info.block_size, 2), blocks.reshape(-1)))
    path = tmp_path_factory.mktemp("iq") / "iq.gguf"
    write_gguf(path, {"general.architecture": "llama"}, tensors)
    return path


@pytest.mark.parametrize("name", IQ_TYPES)
def test_lens_shows_the_i_quant_block_fields(qtbot, iq_file: Path, name: str) -> None:
    info = TYPES[GGMLType[name]]
    with open_gguf(iq_file) as gguf:
        tensor = f"blk.0.{name.lower()}.weight"
        rec = make_tensor_record(gguf, tensor, block_index=5)
        block_bytes = np.asarray(gguf.rows(tensor)).reshape(-1, info.type_size)[5]
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.set_model(synthetic_model_record())
    lens.set_tensor(rec)
    d = lens.detail
    specs = FIELDS[GGMLType[name]]
    assert [d.fields.item(r, 0).text() for r in range(d.fields.rowCount())] == [s.name for s in specs]
    # the fields tile the block: every byte belongs to exactly one field
    covered = np.zeros(info.type_size, int)
    for s in specs:
        covered[s.offset : s.offset + s.size] += 1
    assert (covered == 1).all()
    assert d.fields.item(len(specs) - 1, 1).text().endswith(str(specs[-1].offset + specs[-1].size - 1))
    assert name in d.formula.text() and f"{8 * info.type_size / info.block_size:.4g} bits/weight" in d.formula.text()
    # the dots are the block's weights, bit for bit what dequantize gives
    assert np.array_equal(rec.block.weights.view(np.uint32), dequantize(block_bytes, info.qtype).view(np.uint32))
    dots = d.block_plot.listDataItems()[1].getData()[1]
    assert np.array_equal(dots, rec.block.weights)
    assert rec.weight_stats["count"] > 0 and "d" in rec.scale_counts
