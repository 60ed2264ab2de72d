"""Screenshot of Compare with searched mixes: the preset sweep, 'Find the best mix' at given sizes, one mix compared.

    xvfb-run -a -s "-screen 0 1920x1080x24" .venv/bin/python tools/shot_compare_mix.py MODEL OUT.png \
        [--size 1920x1080] [--budgets 4.9,4.0] [--no-sweep]

The sensitivities come from the user cache when a search on the same file and calibration text ran
before (gguf-lens quantize --budget-bpw, or the app), so only the verification and the evaluation run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--budgets", default="4.9")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--also-small", action="store_true", help="save a 1280x800 grab too (OUT_1280x800.png)")
    args = ap.parse_args()
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from engine.catalog import resolve_model

    app = QApplication.instance() or QApplication([])
    w = MainWindow(load=False)
    width, height = (int(v) for v in args.size.split("x"))
    w.resize(width, height)
    w.show()
    w.open_model(str(resolve_model(args.model)))
    view = w.compare_view
    todo = ([] if args.no_sweep else ["sweep"]) + [f"mix:{b}" for b in args.budgets.split(",")] + ["compare"]
    state = {"busy": False, "t0": time.monotonic()}

    def idle() -> bool:
        return view.sweep.run.isEnabled() and view.sweep.mix.find.isEnabled() and view.run.isEnabled()

    def tick() -> None:
        if time.monotonic() - state["t0"] > args.timeout:
            print("timed out", file=sys.stderr)
            return finish()
        if w.quant_bridge.file_record is None:
            return
        w.lens_tabs.setCurrentWidget(view)
        if state["busy"]:
            if not idle():
                return
            state["busy"] = False
        if not todo:
            return finish()
        step = todo.pop(0)
        state["busy"] = True
        if step == "sweep":
            view.sweep.run.click()
        elif step.startswith("mix:"):
            view.sweep.mix.set_budget(float(step[4:]))
            view.sweep.mix.find.click()
        else:
            mixes = [p for p in view.sweep.points if p.kind == "mix"]
            if mixes:
                view.compare_point(mixes[0])
            else:
                view.run.click()

    def finish() -> None:
        app.processEvents()
        w.grab().save(args.out)
        if args.also_small:
            w.resize(1280, 800)
            for _ in range(20):
                app.processEvents()
            w.grab().save(str(Path(args.out).with_suffix("")) + "_1280x800.png")
        print(view.sweep.status.text())
        w.close()
        app.quit()

    timer = QTimer(interval=500)
    timer.timeout.connect(tick)
    timer.start()
    app.exec()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
