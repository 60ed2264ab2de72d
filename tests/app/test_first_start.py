"""What a newcomer meets first: the kernel compile's progress in the terminal, a window that fits a laptop's
screen whatever it shows, and an input box whose hint says the model is ready once it is."""
from __future__ import annotations

import io
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QEvent, QObject, QRect
from PySide6.QtWidgets import QApplication

import app.main_window as main_window
from app.main_window import MainWindow
from app.views.chat.view import ChatView
from tools import warm_kernels

ROOT = Path(__file__).resolve().parents[2]
LONG_FILE = "/home/someone/Downloads/models/" + "Meta-Llama-3.1-8B-Instruct-abliterated-my-own-finetune-v2-final." * 2 + "Q4_K_M.gguf"
DOWNLOAD = ("gemma3-270m-instruct: downloading gguf-lens-model-gemma3-270m-it-q8-0==1.0.0 (1/2), 123.4 MB of "
            "291.5 MB at 4.2 MB/s, about 40 s left")
ERROR = ("tensor blk.0.attn_q.weight has type 1234, which is not a ggml type this app knows: the file is damaged "
         "or was made by a newer tool. " + "/a/path/without/spaces/" * 8)


# -- 1. the kernels' first compile, step by step on stderr
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_kernel_steps_print_what_n_of_m_and_elapsed_seconds() -> None:
    clock, out = Clock(), io.StringIO()

    def slow(seconds: float):
        def step() -> None:
            clock.now += seconds
        return step

    def model(progress) -> None:
        progress("reading the GGUF header", 0.0)  # just after the step's line: no line of its own
        clock.now += 20
        progress("preparing the CPU kernels (compiled once, then cached)", 0.4)
        clock.now += 20
        progress("preparing the CPU kernels (compiled once, then cached)", 0.5)
        progress("ready", 1.0)  # at once again: none

    model.takes_progress = True  # type: ignore[attr-defined]
    warm_kernels.run([("Q4_0 weight products", slow(3)), ("Q4_K weight products", slow(30)), ("a model", model)],
                     out=out, clock=clock)
    assert out.getvalue().splitlines() == [  # the first, quick step printed nothing: it ended within QUIET_S
        "[dev] kernels 2/3 (3 s): Q4_K weight products",
        "[dev] kernels 3/3 (33 s): a model",
        "[dev] kernels 3/3 (53 s): a model: preparing the CPU kernels (compiled once, then cached) 40%",
        "[dev] kernels 3/3 (73 s): a model: preparing the CPU kernels (compiled once, then cached) 50%",
        "[dev] kernels ready (3 steps, 73 s)",
    ]


def test_a_long_first_step_gets_its_line_while_it_runs() -> None:
    out = io.StringIO()
    seen: list[str] = []

    def first() -> None:  # numba compiling on import, say: no progress of its own
        time.sleep(0.4)
        seen.append(out.getvalue())

    warm_kernels.run([("loading the kernel modules", first), ("RoPE", lambda: None)], out=out, quiet_s=0.1)
    assert seen == ["[dev] kernels 1/2 (0 s): loading the kernel modules\n"]  # printed before the step ended
    assert out.getvalue().splitlines()[-1] == "[dev] kernels ready (2 steps, 0 s)"


def test_a_warm_cache_is_quiet_and_a_failing_step_is_named() -> None:
    out = io.StringIO()
    warm_kernels.run([("RoPE", lambda: None), ("attention", lambda: None)], out=out)
    assert out.getvalue() == ""

    def broken() -> None:
        raise ValueError("no LLVM")

    with pytest.raises(RuntimeError, match="failed at SwiGLU: ValueError: no LLVM"):
        warm_kernels.run([("SwiGLU", broken)], out=out)


def test_the_steps_cover_every_weight_type_and_dev_runs_them() -> None:
    from engine.kernels.dispatch import VEC_DOT_TYPE

    names = [what for what, _fn in warm_kernels.steps()]
    assert len(names) == len(set(names))
    assert {f"{t.name} weight products" for t in VEC_DOT_TYPE} <= set(names)
    assert any("smollm2" in n for n in names) and any("gemma3" in n for n in names)
    assert '"$VENV/bin/python" -m tools.warm_kernels' in (ROOT / "dev").read_text()


# -- 2. the window fits the screen, whatever it shows
@pytest.fixture(params=[(1366, 768), (1280, 800)], ids=["1366x768", "1280x800"])
def screen(request, monkeypatch: pytest.MonkeyPatch) -> QRect:
    area = QRect(0, 0, *request.param)
    monkeypatch.setattr(main_window, "available_area", lambda _widget: QRect(area))
    return area


def fits(w: MainWindow, area: QRect) -> None:
    QApplication.processEvents()
    hint = w.minimumSizeHint()
    assert hint.width() <= area.width() and hint.height() <= area.height(), (hint, area)
    assert area.contains(w.frameGeometry()), (w.frameGeometry(), area)


def test_first_window_opens_inside_the_screen_and_stays_there(qtbot, data_dir: Path, screen: QRect,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    assert w.width() <= screen.width() and w.height() <= screen.height()
    w.show()
    qtbot.waitUntil(lambda: w.shown_once)
    fits(w, screen)
    st = w.state  # the status bar as a loaded model and a reply fill it
    w.status._model(SimpleNamespace(name="Smollm2 135M 8k Lc100K Mix1 Ep2"))
    st.backend, st.tok_s, st.ctx_size, st.ctx_used = "CPU · numba kernels", 123.4, 8192, 1234
    st.kv_bytes, st.kv_full_bytes, st.attention_path = 12_345_678, 90_000_000, "tiled (online softmax)"
    fits(w, screen)
    st.loading = (DOWNLOAD, 0.4)  # the catalog download's progress in the status bar
    fits(w, screen)
    assert w.status.progress_label.text() == DOWNLOAD and w.status.progress_label.toolTip() == DOWNLOAD
    monkeypatch.setattr(w.engine, "open_model", lambda source: None)
    w.open_model(LONG_FILE)  # a user's file with a long name
    fits(w, screen)
    w.state.loading = None
    w.chat_view.show_banner("warning", ERROR)
    w._load_failed(ERROR)
    fits(w, screen)
    w.load_error_box.close()
    w.resize(screen.width(), screen.height())  # a resize to the screen is honoured: no widget wants more
    QApplication.processEvents()
    assert w.width() <= screen.width() and w.height() <= screen.height()
    w.close()


def test_a_geometry_saved_on_a_larger_screen_is_fitted(qtbot, data_dir: Path, screen: QRect,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main_window, "available_area", lambda _widget: None)  # the big screen of last time
    big = MainWindow(load=False)
    qtbot.addWidget(big)
    big.setGeometry(900, 500, 2400, 1300)
    big.show()
    big.close()  # saves the geometry
    monkeypatch.setattr(main_window, "available_area", lambda _widget: QRect(screen))
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    assert w.state.settings.geometry
    assert screen.contains(w.frameGeometry()), (w.frameGeometry(), screen)
    w.show()
    qtbot.waitUntil(lambda: w.shown_once)
    fits(w, screen)
    w.close()


# -- 3. the input box's hint follows the model
class PaintedHints(QObject):
    """Records the placeholder text each time the input box's viewport is painted."""

    def __init__(self, view: ChatView) -> None:
        super().__init__()
        self.view, self.seen = view, []
        view.input.viewport().installEventFilter(self)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Paint:
            self.seen.append(self.view.input.placeholderText())
        return False


def test_placeholder_is_repainted_when_it_changes(qtbot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.show()
    qtbot.waitExposed(view)
    view.set_placeholder("Loading the model… (you can type already)")
    hints = PaintedHints(view)
    qtbot.waitUntil(lambda: "Loading the model… (you can type already)" in hints.seen)
    view.set_placeholder("Message the model…")
    assert view.input.placeholderText() == "Message the model…"
    qtbot.waitUntil(lambda: "Message the model…" in hints.seen, timeout=120_000)


@pytest.mark.slow
def test_loading_hint_goes_as_soon_as_the_model_is_loaded(qtbot, smollm2_path: Path, data_dir: Path) -> None:
    w = MainWindow(model=str(smollm2_path))
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    hints = PaintedHints(w.chat_view)
    qtbot.waitUntil(lambda: "Loading the model… (you can type already)" in hints.seen, timeout=10_000)
    qtbot.waitUntil(lambda: w.state.model is not None, timeout=180_000)
    assert w.chat_view.input.placeholderText() == "Message the model…"
    qtbot.waitUntil(lambda: hints.seen[-1] == "Message the model…", timeout=120_000)  # painted, not only set
    w.close()
