"""Compare offers the adapters the Experiments tab has on the chat's model as B (issue 43 item 3), and B can be the file
with a control vector as well as with a LoRA adapter.

The view lists each loaded adapter with its scale and asks for no file; a B chosen among them stays chosen while it is
on and stays B (as a file chosen in Compare) when it goes. The job's per-position KLD with a control vector as B equals
one computed here from the engine's own runs with and without it (tools/make_cvec_fixtures.py's vector 'a'); a LoRA
adapter asked for next takes the control vector's place.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from app.jobs.compare import CompareWorkspace, compare_job
from app.records.compare import CompareOptions, CompareRecord, TaskProgress
from app.records.interventions import LoadedAdapter
from app.views.compare.view import CompareView
from engine.intervene import control_vector, lora
from engine.model import load_model
from tools.make_cvec_fixtures import write_cvec
from tools.make_lora_fixtures import write_lora

TEXT = "A control vector pushes every token a little; some of them more than others. " * 2


def test_the_view_offers_the_loaded_adapters(qtbot, tmp_path: Path) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    style = LoadedAdapter("lora", str(tmp_path / "style.gguf"), 0.5)
    calm = LoadedAdapter("cvec", str(tmp_path / "calm.gguf"), 0.8)
    view.set_loaded_adapters((style, calm))
    items = [view.source.itemText(i) for i in range(view.source.count())]
    assert items[items.index("file + LoRA…") + 1:][:2] == ["Experiments: LoRA style.gguf x0.5",
                                                           "Experiments: control vector calm.gguf x0.8"]
    view.source.select("loaded:1")
    opts = view.options()
    assert (opts.b_source, opts.b_path, opts.b_scale) == ("adapter", calm.path, 0.8)
    assert view.b_scale.isHidden() and view.choose_adapter.isHidden()  # no file asked for, the scale is Experiments'
    view.set_loaded_adapters((calm,))  # the LoRA went: the control vector stays chosen
    assert view.source.loaded_choice() == calm and view.options().b_path == calm.path
    view.set_loaded_adapters(())  # it went too: B stays the same file and scale, now as an adapter chosen here
    opts = view.options()
    assert (opts.b_source, opts.b_path, opts.b_scale) == ("adapter", calm.path, 0.8)
    assert view.source.findData("loaded:0") < 0 and view.source.currentText() == "file + LoRA calm.gguf"


def _compare(ws: CompareWorkspace, path: Path, adapter: Path, scale: float) -> CompareRecord:
    opts = CompareOptions(b_source="adapter", b_path=str(adapter), b_scale=scale, text=TEXT, max_tokens=40)
    items = list(compare_job(ws, str(path), opts, None, threading.Event(), lambda item: None))
    return next(i for i in items if isinstance(i, CompareRecord) and not isinstance(i, TaskProgress))


def _logp(path: Path, ids: list[int], cvec: Path | None, scale: float) -> np.ndarray:
    model = load_model(path)
    try:
        if cvec is not None:
            a = model.args
            control_vector.apply(model, control_vector.load([(str(cvec), scale)], a.dim, a.n_layers, model.arch))
        x = model.net.forward(ids, model.new_cache(len(ids), "F32"), all_logits=True).astype(np.float64)
        return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
    finally:
        model.close()


def test_b_is_the_file_with_a_control_vector(smollm2_path: Path, tmp_path: Path) -> None:
    cvec, adapter = write_cvec(tmp_path, "a"), write_lora(tmp_path, "a")
    loaded: list = []  # every model the workspace loads (a job closes its models when it ends)
    ws = CompareWorkspace(lambda path, **kw: loaded.append(load_model(path, **kw)) or loaded[-1])
    try:
        rec = _compare(ws, smollm2_path, cvec, 0.5)
        assert rec.b_label == f"file + control vector {cvec.name} x0.5"
        ids = [int(i) for i in rec.token_ids]
        p, q = _logp(smollm2_path, ids, None, 0.0), _logp(smollm2_path, ids, cvec, 0.5)
        want = (np.exp(p) * (p - q)).sum(-1)
        assert rec.kld.shape == want.shape and np.allclose(rec.kld, want, rtol=1e-3, atol=1e-6)
        assert float(rec.kld.mean()) > 1e-3
        again = _compare(ws, smollm2_path, adapter, 1.0)  # a LoRA adapter in the control vector's place
        assert ws.adapted is None  # closed with the job
        b = loaded[-1]  # B of the second comparison: the file with the LoRA adapter alone
        assert again.b_label == f"file + LoRA {adapter.name} x1"
        assert control_vector.current(b) is None and [a.name for a in lora.current(b)] == [adapter.name]
    finally:
        ws.close()
