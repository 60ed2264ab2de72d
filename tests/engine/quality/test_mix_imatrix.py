"""The mix search with an importance matrix on SmolLM2: the CLI writes a file quantized with the matrix's weights,
our engine and llama.cpp load it, and `compare --against` measures its KLD; the solver fills its budget."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.cli.main import main
from engine.gguf import open_gguf
from engine.quality.imatrix import read_imatrix
from engine.quality.mix_search import solve
from engine.quality.sensitivity import Sensitivities, TensorSensitivity, candidate_types
from engine.quant import dequantize_rows, quantize
from engine.quant.types import TYPES, GGMLType
from tests.llama_cpp_tools import llama_cpp_n_vocab, need_llama_python

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
IMATRIX = FIXTURES / "imatrix" / "smollm2.imatrix.gguf"  # llama-imatrix's (tools/make_imatrix_fixtures.py)
CALIB = ("The river ran past the mill and the old stone bridge, where the children counted boats and argued "
         "about the colour of the water in spring.")


def _json_line(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow  # quantizes every SmolLM2 tensor with the imatrix-weighted quantizers: about 80 s of CPU
def test_search_with_an_imatrix_writes_a_file_llama_cpp_loads(smollm2_path: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    calib = tmp_path / "calib.txt"
    calib.write_text(CALIB, encoding="utf-8")
    out = tmp_path / "mix.gguf"
    budget = 5.455  # the size of SmolLM2's Q3_K_M preset: the file (5.744 bpw) must narrow
    assert main(["quantize", str(smollm2_path), str(out), "--budget-bpw", str(budget), "--imatrix", str(IMATRIX),
                 "--calibration-text", str(calib), "--calibration-tokens", "16", "--group-layers", "30",
                 "--no-cache", "--no-verify", "--json"]) == 0
    report = _json_line(capsys.readouterr().out)
    assert 0.99 * budget <= report["file_bpw"] <= budget  # within 1% of the budget
    im = read_imatrix(IMATRIX)
    with open_gguf(smollm2_path) as src, open_gguf(out) as g:
        assert g.metadata.get("quantize.imatrix.file") == str(IMATRIX)
        changed = [n for n, q in report["types"].items() if q != src.tensors[n].qtype.name]
        assert changed and {n: g.tensors[n].qtype.name for n in report["types"]} == report["types"]
        # a changed matrix with importance values and a weighted type holds the imatrix-weighted quantizer's
        # blocks, which differ from the plain quantizer's
        weighted = [n for n in changed if im.values(n) is not None and report["types"][n] != "Q8_0"]
        assert weighted, changed
        name = weighted[0]
        info = src.tensors[name]
        w = dequantize_rows(src.rows(name), info.qtype).reshape(-1, int(info.shape[0]))
        q = GGMLType[report["types"][name]]
        blocks = np.asarray(g.rows(name)).reshape(w.shape[0], -1)
        assert np.array_equal(blocks, quantize(w, q, im.values(name)))
        assert not np.array_equal(blocks, quantize(w, q))
    text = FIXTURES / "prose.txt"
    assert main(["compare", str(smollm2_path), "--text-file", str(text), "--against", str(out),
                 "--max-tokens", "48", "--json"]) == 0
    cmp = _json_line(capsys.readouterr().out)
    assert cmp["other"] == out.name and np.isfinite(cmp["kld_mean"]) and 0 < cmp["kld_mean"] < 1.0
    need_llama_python()  # loaded by GGUF Lens above; by llama.cpp from here
    assert llama_cpp_n_vocab(out, "The river ran past the mill") == 49152


def _upgrades(n: int = 40) -> Sensitivities:
    """Tensors stored as Q4_1 whose wider types cost a little KLD each (the file itself is the reference)."""
    tensors = {}
    rng = np.random.default_rng(1)
    for i in range(n):
        n_cols, n_rows = (576, 576) if i % 4 else (1536, 576)
        types = candidate_types(n_cols, GGMLType.Q4_1)
        nbytes = {q.name: n_rows * TYPES[q].row_bytes(n_cols) for q in types}
        scale = float(rng.uniform(0.5, 2.0))
        err = {q.name: 0.0 if q == GGMLType.Q4_1 else scale * 2.0 ** -TYPES[q].bits_per_weight for q in types}
        name = f"blk.{i}.t.weight"
        tensors[name] = TensorSensitivity(name, i, n_rows * n_cols, "Q4_1", "Q4_0", scale * 1e-3, nbytes, err)
    return Sensitivities(tensors, 0, sum(s.n_elements for s in tensors.values()), 64)


def test_the_solver_fills_the_budget_within_one_percent() -> None:
    sens = _upgrades()
    for bpw in (4.6, 5.3, 6.2, 7.0):  # below the file's 5.0 bpw and above it
        loose = solve(sens, bpw)
        full = solve(sens, bpw, min_fill=0.99)
        assert 0.99 * bpw <= full.bpw <= bpw and not full.note
        assert full.predicted_kld >= loose.predicted_kld  # the floor only narrows the choice
        widened = solve(sens, bpw, min_fill=0.99, widen=True)  # the unbounded best, widened up to the floor
        assert 0.99 * bpw <= widened.bpw <= bpw and widened.widened and not full.widened
        assert widened.predicted_kld >= full.predicted_kld - 1e-15  # the knapsack is the optimum of the prediction
        if bpw > 5.0:
            assert loose.predicted_kld == 0.0 and loose.bpw == pytest.approx(5.0)  # the file itself is the best
            assert 0 < full.predicted_kld < 0.2 * solve(sens, 4.6).predicted_kld  # widening costs less than narrowing
    past_q8 = solve(sens, 9.5, min_fill=0.99)  # every tensor at Q8_0 is 8.5 bpw: F16 fills the rest
    assert 0.99 * 9.5 <= past_q8.bpw <= 9.5 and "F16" in past_q8.types.values() and not past_q8.note
    over = solve(sens, 17.0, min_fill=0.99)  # nothing is wider than F16
    assert over.bpw == pytest.approx(16.0) and "at most 16.000 bpw" in over.note
