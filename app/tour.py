"""python -m app.tour MODEL --out DIR: drive the real window through issue 15's seven questions, a PNG per answer.

    xvfb-run -a -s "-screen 0 1280x800x24" python -m app.tour smollm2-135m-instruct --out shots --size 1280x800

It loads the model, sends one message, then for each question shows the tab (and the view) that answers it,
waits until that view has computed its answer, and saves the whole window as DIR/qN_<name>.png:

| q | answer | how it gets there |
| --- | --- | --- |
| q1 | Attention > Head roles on the induction probe, coloured by "previous" | Run induction probe |
| q2 | Attention > Head roles on the chat, coloured by "sink", with the sinks listed | Score this chat |
| q1g | Attention > Overview: every thumbnail framed by its "previous" score (the chat's, from q2) | the roles' score |
| q3 | the Positions lens (RoPE at a distance d, every base side by side) | the tab as it is |
| q4 | Compare: per-layer divergence of A and the Q2_K preset (B) | B = preset Q2_K on TOUR_TOKENS tokens, Compare |
| q5 | Compare: the preset sweep (KLD against MB) | a sweep of TOUR_PRESETS on TOUR_TOKENS tokens (all 14 take minutes) |
| q6 | Quantization: a tensor whose type is a fallback, with the reason | the first tensor whose reason says so |
| q7 | Attention > Logit lens at the last position | Decode layers |
| q7c | Compare > Logit lens: A and B side by side (after q4's comparison) | Logit lens of A and B |

PREPARE[q] sets the tab up for question q and READY[q] says when its answer is drawn; both take the tour and what
the tab shows (a lens, or the Compare view) and use only the widgets' public methods and signals.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.main_window import MainWindow
    from app.views.attention.lens import AttentionLens
    from app.views.compare.view import CompareView
    from app.views.quant.lens import QuantLens

QUESTIONS = ("q1", "q2", "q1g", "q3", "q4", "q5", "q6", "q7", "q7c")
NAMES = {"q1": "head_roles_probe", "q2": "sinks", "q1g": "grid_by_role", "q3": "positions_rope", "q4": "compare_layers",
         "q5": "compare_presets", "q6": "quant_fallback", "q7": "logit_lens", "q7c": "compare_logit_lens"}
TAB = {"q1": "Attention", "q2": "Attention", "q1g": "Attention", "q3": "Positions", "q4": "Compare", "q5": "Compare",
       "q6": "Quantization", "q7": "Attention", "q7c": "Compare"}
STEP_TIMEOUT_S = {"q4": 600.0, "q5": 900.0, "q7c": 600.0}  # the comparison and the preset sweep run models; the rest is quick
COMPARE_PRESET = "Q2_K"  # q4 asks which layers Q2_K hurts most
TOUR_PRESETS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")  # q5 asks about Q4_K_M against Q8_0
TOUR_TOKENS = 160  # of the evaluation text, for the tour's comparison and sweep (the app's default is 512)
PROGRESS_S = 30.0  # a long step logs its progress this often
SETTLE_S = 1.5  # after a view says it is ready: let throttled redraws land
log = logging.getLogger(__name__)


@dataclasses.dataclass
class Asked:
    """What the current question's hooks remember between ticks (a fresh one per question)."""

    quant_tensor: str | None = None  # q6: the tensor asked for in the Quantization lens
    pair_asked: bool = False  # q7c: the logit lens of A and B was asked for
    logged_at: float = 0.0  # a long step's last progress line


class Tour:
    """Drives the window from a QTimer: load, one reply, then each question's tab until its answer is drawn."""

    def __init__(self, window: MainWindow, out: Path, prompt: str, questions: Sequence[str], timeout_s: float,
                 suffix: str = ""):
        from PySide6.QtCore import QTimer

        self.w = window
        self.out = out
        self.prompt = prompt
        self.todo = list(questions)
        self.suffix = suffix
        self.deadline = time.monotonic() + timeout_s
        self.sent = False
        self.current: str | None = None
        self.started = 0.0
        self.ready_at = 0.0
        self.asked = Asked()
        self.saved: list[Path] = []
        self.code = 0
        self.timer = QTimer(interval=250)
        self.timer.timeout.connect(self.tick)
        self.timer.start()

    # ---- the loop

    def tick(self) -> None:
        w, now = self.w, time.monotonic()
        if now > self.deadline:
            log.error("tour: out of time; stopping")
            return self.finish(1)
        if not self.sent:
            if w.load_error_box is not None and w.state.model is None:
                log.error("tour: the model could not be loaded")
                return self.finish(1)
            if w.state.model is not None and not w.engine.loading:
                w.conversation.new_chat()
                self.w.lens_tabs.select("Attention")
                self.sent = w.conversation.send(self.prompt)
                log.info("tour: model loaded, message sent")
            return None
        if w.conversation.generating or w.state.attention_record is None:
            return None
        if self.current is None:
            if not self.todo:
                return self.finish(self.code)
            self.current = self.todo.pop(0)
            self.started, self.ready_at, self.asked = now, 0.0, Asked()
            log.info("tour: %s (%s tab)", self.current, TAB[self.current])
            self.w.lens_tabs.select(TAB[self.current])
            self._prepare(self.current)
            return None
        q = self.current
        if not self.ready_at:
            if self._ready(q) or now - self.started > STEP_TIMEOUT_S.get(q, 180.0):
                if not self._ready(q):
                    log.warning("tour: %s not ready after %.0f s; saving what is on screen", q, now - self.started)
                    self.code = 1
                self.ready_at = now
            return None
        if now - self.ready_at >= SETTLE_S:
            self._save(q)
            self.current = None
        return None

    def finish(self, code: int) -> None:
        from PySide6.QtWidgets import QApplication

        self.timer.stop()
        self.code = code
        print(f"tour: {len(self.saved)} screenshots in {self.out}", file=sys.stderr)
        self.w.close()
        QApplication.instance().exit(code)

    # ---- helpers

    def _widget(self, title: str) -> Any:
        """What the tab shows: a lens or the Compare view (PREPARE and READY take it)."""
        return self.w.lens_tabs.content(title)

    def _save(self, q: str) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{q}_{NAMES[q]}{self.suffix}.png"
        ok = self.w.grab().save(str(path))
        print(f"tour: {'saved' if ok else 'could not save'} {path}", file=sys.stderr)
        if ok:
            self.saved.append(path)
        else:
            self.code = 2

    def _prepare(self, q: str) -> None:
        widget = self._widget(TAB[q])
        if widget is None:
            return
        prepare = PREPARE.get(q)
        if prepare is not None:
            prepare(self, widget)

    def _ready(self, q: str) -> bool:
        widget = self._widget(TAB[q])
        if widget is None:
            return False
        ready = READY.get(q)
        return True if ready is None else bool(ready(self, widget))


# ---- the questions, for tabs without their own hooks


def _roles(source: str, role: str) -> Callable[[Tour, Any], None]:
    def prepare(tour: Tour, lens: AttentionLens) -> None:
        lens.views.setCurrentWidget(lens.roles)
        lens.roles.set_role(role)
        lens.roles.roles_requested.emit(source)

    return prepare


def _roles_ready(source: str) -> Callable[[Tour, Any], bool]:
    return lambda tour, lens: lens.roles.record is not None and lens.roles.record.source == source


def _grid_prepare(tour: Tour, lens: AttentionLens) -> None:
    lens.roles.set_role("previous")
    lens.views.setCurrentWidget(lens.overview)


def _grid_ready(tour: Tour, lens: AttentionLens) -> bool:
    return bool(lens.grid.frames) or lens.roles.record is None


def _compare_prepare(tour: Tour, view: CompareView) -> None:
    """B = the Q2_K preset, chosen in Compare's own menu, on the first TOUR_TOKENS tokens; then Compare."""
    view.show_page("summary")
    if view.record is not None:
        return
    view.b_preset.setCurrentText(COMPARE_PRESET)
    view.source.setCurrentIndex(view.source.findData("preset"))
    view.max_tokens.setValue(TOUR_TOKENS)
    view.compare_requested.emit(view.options())


def _compare_ready(tour: Tour, view: CompareView) -> bool:
    """The comparison and its head pair have arrived (or the comparison failed)."""
    return (view.record is not None and view.heads.pair is not None) or "stopped" in view.status.text()


def _sweep_prepare(tour: Tour, view: CompareView) -> None:
    """Sweep TOUR_PRESETS on TOUR_TOKENS tokens (the Sweep button measures all 14 on 512: many minutes)."""
    from app.data.overrides import eval_text

    view.show_page("sweep")
    tour.w.quant_bridge.run_sweep(eval_text(), TOUR_PRESETS, TOUR_TOKENS)


def _sweep_ready(tour: Tour, view: CompareView) -> bool:
    sweep = view.sweep
    if sweep.run.isEnabled():
        return True
    now = time.monotonic()
    if now - tour.asked.logged_at > PROGRESS_S:
        tour.asked.logged_at = now
        log.info("tour: q5 %s, %d points", sweep.progress.text(), len(sweep.points))
    return False


def _quant_prepare(tour: Tour, lens: QuantLens) -> None:
    reasons = dict(lens.reasons)
    fallback = [n for n, why in reasons.items() if "fall" in why.lower() or "multiple" in why.lower()]
    name = (fallback or sorted(reasons) or [None])[0]
    if name is not None:
        lens.open_tensor(name)
    tour.asked.quant_tensor = name


def _quant_ready(tour: Tour, lens: QuantLens) -> bool:
    name, rec = tour.asked.quant_tensor, lens.tensor
    return name is None or (rec is not None and rec.name == name)


def _logit_prepare(tour: Tour, lens: AttentionLens) -> None:
    lens.views.setCurrentWidget(lens.logit)
    if not lens.logit.stale():
        return
    lens.logit.request()


def _logit_ready(tour: Tour, lens: AttentionLens) -> bool:
    rec = lens.logit.panel.record
    return rec is not None and rec.n_tokens == lens.logit.n_tokens


def _pair_prepare(tour: Tour, view: CompareView) -> None:
    _compare_prepare(tour, view)  # q7c alone: run the comparison first (not the sweep)
    view.show_page("logit")
    tour.asked.pair_asked = False


def _pair_ready(tour: Tour, view: CompareView) -> bool:
    pair = view.logit_pair
    if pair.pair is not None:
        return True
    if not tour.asked.pair_asked and pair.n_tokens:
        tour.asked.pair_asked = True
        pair.request()
    return False


PREPARE: dict[str, Callable[[Tour, Any], None]] = {
    "q1": _roles("probe", "induction"), "q2": _roles("chat", "sink"), "q1g": _grid_prepare, "q4": _compare_prepare,
    "q5": _sweep_prepare, "q6": _quant_prepare, "q7": _logit_prepare, "q7c": _pair_prepare,
}
READY: dict[str, Callable[[Tour, Any], bool]] = {
    "q1": _roles_ready("probe"), "q2": _roles_ready("chat"), "q1g": _grid_ready, "q4": _compare_ready,
    "q5": _sweep_ready,
    "q6": _quant_ready, "q7": _logit_ready, "q7c": _pair_ready,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.tour", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a .gguf path or catalog name")
    p.add_argument("--out", required=True, type=Path, help="folder for the PNGs")
    p.add_argument("--size", default="1280x800", help="window size WxH (run Xvfb with a screen at least this big)")
    p.add_argument("--questions", default=",".join(QUESTIONS), help="which of q1..q7, q1g and q7c, comma-separated")
    p.add_argument("--prompt", default="In two sentences, what does attention do in a transformer? "
                                        "Attention lets every token look at the tokens before it.")
    p.add_argument("--max-tokens", type=int, default=48, help="the reply's length (short keeps the tour quick)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole tour")
    p.add_argument("--suffix", default="", help="appended to every file name (e.g. _1280)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    questions = [q.strip() for q in args.questions.split(",") if q.strip()]
    bad = [q for q in questions if q not in QUESTIONS]
    if bad:
        print(f"unknown question(s) {', '.join(bad)}: choose from {', '.join(QUESTIONS)}", file=sys.stderr)
        return 2
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        print(f"--size must be WxH, got {args.size!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "gguf-lens"])
    app.setApplicationName("GGUF Lens")
    window = MainWindow(model=args.model)
    window.state.settings = dataclasses.replace(window.state.settings, max_tokens=args.max_tokens, seed=0)
    window.resize(width, height)
    window.show()
    tour = Tour(window, args.out, args.prompt, questions, args.timeout, args.suffix)
    code = app.exec()
    if not window.closed:
        window.shutdown()
    return tour.code or code


if __name__ == "__main__":
    raise SystemExit(main())
