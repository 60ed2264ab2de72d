"""A per-tensor quantization mix under a size budget: the types that minimise the KLD to the file.

The search: measure every tensor's sensitivity (engine.quality.sensitivity), choose one candidate
type per tensor so that the predicted KLD (the sum of the tensors' own KLDs) is smallest while the
file stays under the budget (an exact multiple-choice knapsack over sizes rounded up to a grid, so
the budget always holds), then verify: the whole mix is run on the calibration tokens and its real
KLD measured. Variants of the prediction (KLD growing faster or slower than the weighted error) are
solved and verified too and the best measured mix wins ("verify and adjust"). The result is a list
of `--tensor-type` rules that llama-quantize and `gguf-lens quantize` both accept.
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import SettingError
from engine.quality.sensitivity import (
    Measurer,
    Quantizer,
    Sensitivities,
    layer_of,
    plain_quantizer,
)
from engine.quant import dequantize_rows
from engine.quant.types import TYPES, GGMLType

if TYPE_CHECKING:
    from engine.model import Model

Progress = Callable[[str, float], None]
RESOLUTION = 4000  # sizes are rounded up to budget/RESOLUTION bytes in the knapsack
MAX_GRID = 100_000  # the finest grid a size floor may ask for (the picks table is items x grid int16)
MIN_FILL = 0.99  # a mix is at least this share of its budget where the candidate types allow it
EXPONENTS = (1.0, 0.7, 1.4)  # KLD ~ E^a around the probe: the variants solved and verified
# the preset whose llama_ftype a mix is written with: the one whose base type holds most of its weights
_PRESET_OF_TYPE = {"Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q4_K": "Q4_K_M",
                   "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q5_K": "Q5_K_M", "Q6_K": "Q6_K", "Q8_0": "Q8_0"}


def solve_choices(options: Sequence[Sequence[tuple[int, float]]], budget: int,
                  resolution: int = RESOLUTION, floor: int = 0) -> tuple[list[int], float]:
    """Pick one (bytes, cost) option per item minimising the summed cost with floor <= summed bytes <= budget.

    An exact dynamic programme over the bytes above each item's cheapest option, rounded up to a
    grid of (spare bytes)/resolution (exact when the sizes are multiples of the grid); with a floor the
    grid is made fine enough that the window [floor, budget] spans several units per item, and only
    sums that stay in the window whatever the rounding are taken. What the rounding left is spent with
    exact sizes afterwards. A floor that no choice reaches is approached as near as the budget allows.
    Returns the chosen option of each item and the total cost; SettingError when even the cheapest
    options do not fit.
    """
    if not options or any(not o for o in options):
        raise SettingError("every tensor needs at least one candidate type")
    base = [min(b for b, _ in o) for o in options]
    spare = budget - sum(base)
    if spare < 0:
        raise SettingError(f"the budget ({budget} bytes) is below the smallest mix ({sum(base)} bytes)")
    n = len(options)
    floor = min(floor, budget)
    grid = resolution
    if floor > sum(base):
        grid = max(grid, min(MAX_GRID, math.ceil(4 * n * spare / max(1, budget - floor))))
    unit = max(1, math.ceil(spare / max(1, grid)))
    cap = spare // unit
    best = np.full(cap + 1, np.inf)  # best[c]: least cost of the items so far with exactly c units spent
    best[0] = 0.0
    picks = np.zeros((n, cap + 1), np.int16)
    steps = []
    for i, opts in enumerate(options):
        new = np.full(cap + 1, np.inf)
        pick = np.zeros(cap + 1, np.int16)
        step = [math.ceil((nbytes - base[i]) / unit) for nbytes, _ in opts]
        for j, (_, cost) in enumerate(opts):
            c = step[j]
            if c > cap:
                continue
            cand = np.full(cap + 1, np.inf)
            cand[c:] = best[: cap + 1 - c] + cost
            better = cand < new
            new[better] = cand[better]
            pick[better] = j
        best, picks[i] = new, pick
        steps.append(step)
    # a sum of c rounded-up units is at least c - slack units of real bytes (slack 0 when the sizes are whole units)
    slack = math.ceil(sum(max(s - (o[0] - b) / unit for s, o in zip(step, opts))
                          for step, opts, b in zip(steps, options, base)) - 1e-9)
    low = 0 if floor <= sum(base) else min(cap, math.ceil((floor - sum(base)) / unit) + slack)
    window = best[low:]
    c = low + int(np.argmin(window)) if np.isfinite(window).any() else int(np.argmax(np.where(np.isfinite(best), np.arange(cap + 1), -1)))
    chosen = [0] * n
    for i in range(n - 1, -1, -1):
        j = int(picks[i, c])
        chosen[i] = j
        c -= steps[i][j]
    _raise(options, chosen, budget, floor)
    _fill(options, chosen, budget, floor)
    return chosen, float(sum(options[i][j][1] for i, j in enumerate(chosen)))


def _size(options: Sequence[Sequence[tuple[int, float]]], chosen: Sequence[int]) -> int:
    return sum(options[i][j][0] for i, j in enumerate(chosen))


def _raise(options: Sequence[Sequence[tuple[int, float]]], chosen: list[int], budget: int, floor: int) -> None:
    """Below the floor (the grid's rounding, or a window no sum of units hit): the least cost added per byte
    gained that still fits the budget, until the floor is reached or nothing fits."""
    size = _size(options, chosen)
    while size < floor:
        best: tuple[float, int, int] | None = None
        for i, opts in enumerate(options):
            b0, c0 = opts[chosen[i]]
            for j, (b, c) in enumerate(opts):
                if b > b0 and size + b - b0 <= budget:
                    price = (c - c0) / min(b - b0, floor - size)  # bytes past the floor are not worth more
                    if best is None or price < best[0]:
                        best = (price, i, j)
        if best is None:
            return
        _, i, j = best
        size += options[i][j][0] - options[i][chosen[i]][0]
        chosen[i] = j


def _fill(options: Sequence[Sequence[tuple[int, float]]], chosen: list[int], budget: int, floor: int = 0) -> None:
    """Spend what the grid's rounding left: the best cost saved per byte that still fits (and keeps the
    floor, when the mix is above it), until none does."""
    size = _size(options, chosen)
    keep = min(floor, size)
    while True:
        best: tuple[float, int, int] | None = None
        for i, opts in enumerate(options):
            b0, c0 = opts[chosen[i]]
            for j, (b, c) in enumerate(opts):
                if c < c0 and keep <= size + b - b0 <= budget:
                    gain = (c0 - c) / max(b - b0, 1)  # a cheaper and better option first
                    if best is None or gain > best[0]:
                        best = (gain, i, j)
        if best is None:
            return
        _, i, j = best
        size += options[i][j][0] - options[i][chosen[i]][0]
        chosen[i] = j


@dataclass(frozen=True)
class MixPlan:
    """A type for every quantizable tensor, its size and its KLD (predicted; measured once verified)."""

    types: dict[str, str]  # tensor name -> type name, for every tensor a mix may change
    file_types: dict[str, str]
    nbytes: int  # every tensor's bytes, the fixed ones included
    n_elements: int
    predicted_kld: float
    measured_kld: float | None = None
    exponent: float = 1.0
    budget_bpw: float = 0.0
    note: str = ""  # why the mix is further below the budget than asked, when it is
    widened: bool = False  # the best mix under the budget, widened up to the floor (solve's widen)

    @property
    def bpw(self) -> float:
        return 8.0 * self.nbytes / max(1, self.n_elements)

    @property
    def changed(self) -> dict[str, str]:
        return {n: q for n, q in self.types.items() if q != self.file_types[n]}

    def rules(self) -> list[str]:
        """`--tensor-type` rules giving every tensor its type: tensors of one role and type share a rule."""
        groups: dict[tuple[str, str], list[int]] = {}
        singles: list[tuple[str, str]] = []
        for name, q in self.types.items():
            m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
            if m is None:
                singles.append((name, q))
            else:
                groups.setdefault((m.group(2), q), []).append(int(m.group(1)))
        out = [f"^{re.escape(n)}$={q}" for n, q in singles]
        for (role, q), layers in groups.items():
            nums = "|".join(str(i) for i in sorted(layers))
            out.append(f"^blk\\.({nums})\\.{re.escape(role)}$={q}")
        return out

    def preset(self) -> str:
        """The llama-quantize type to name on its command line (its ftype is written; every tensor has a rule)."""
        weight: dict[str, int] = {}
        for q in self.types.values():
            weight[q] = weight.get(q, 0) + 1
        for q, _ in sorted(weight.items(), key=lambda kv: -kv[1]):
            if q in _PRESET_OF_TYPE:
                return _PRESET_OF_TYPE[q]
        return "Q8_0"

    def counts(self) -> dict[str, int]:
        """How many tensors take each type."""
        out: dict[str, int] = {}
        for q in self.types.values():
            out[q] = out.get(q, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: TYPES[GGMLType[kv[0]]].bits_per_weight))

    def summary(self) -> str:
        kld = f"KLD {self.measured_kld:.5f} measured" if self.measured_kld is not None else "not verified"
        mix = ", ".join(f"{n} {q}" for q, n in self.counts().items())
        note = f"; {self.note}" if self.note else ""
        return (f"{self.nbytes / 2**20:.2f} MiB, {self.bpw:.3f} bpw (budget {self.budget_bpw:.3f}); predicted KLD "
                f"{self.predicted_kld:.5f}, {kld}; {len(self.changed)} of {len(self.types)} tensors change ({mix}){note}")

    def as_dict(self) -> dict[str, Any]:
        return {"types": self.types, "nbytes": self.nbytes, "bpw": self.bpw, "budget_bpw": self.budget_bpw,
                "predicted_kld": self.predicted_kld, "measured_kld": self.measured_kld, "exponent": self.exponent,
                "rules": self.rules(), "preset": self.preset(), "n_changed": len(self.changed), "note": self.note,
                "widened": self.widened}


def _kld(s: Any, q: str, exponent: float) -> float:
    """A tensor's predicted KLD at type q with KLD ~ E^exponent through the probe."""
    if exponent == 1.0 or q == s.file_type:
        return s.kld(q)
    e, ep = s.error[q], s.error[s.probe]
    return 0.0 if e <= 0 or ep <= 0 else max(0.0, s.probe_kld) * (e / ep) ** exponent


def solve(sens: Sensitivities, budget_bpw: float, exponent: float = 1.0, resolution: int = RESOLUTION,
          min_fill: float = 0.0, widen: bool = False) -> MixPlan:
    """The mix with the least predicted KLD whose file is at most budget_bpw bits per weight and, when it can
    be, at least min_fill of that (0.99: within 1% of the budget, even where a smaller mix would be closer
    to the file: a file already under the budget is then widened where that costs least).

    widen: instead of the knapsack over the window, the best mix under the budget alone, then widened
    tensor by tensor (least predicted KLD per byte) up to the floor: another guess for verify to weigh,
    since the prediction of a widening's cost is the least sure part of the model."""
    if not (budget_bpw > 0 and math.isfinite(budget_bpw)):
        raise SettingError(f"--budget-bpw {budget_bpw}: must be a positive number")
    if not 0.0 <= min_fill <= 1.0:
        raise SettingError(f"--min-fill {min_fill}: must be between 0 and 1")
    names = list(sens.tensors)
    exact = budget_bpw * sens.n_elements / 8
    budget = math.floor(exact * (1 + 1e-12)) - sens.fixed_bytes  # a size given as bpw of a real file: its bytes
    floor = math.ceil(min_fill * exact * (1 - 1e-12)) - sens.fixed_bytes if min_fill > 0 else 0
    options = []
    for n in names:
        s = sens.tensors[n]
        options.append([(s.nbytes[q], _kld(s, q, exponent)) for q in s.nbytes])
    smallest = sens.fixed_bytes + sum(min(b for b, _ in o) for o in options)
    if budget < smallest - sens.fixed_bytes:
        raise SettingError(f"--budget-bpw {budget_bpw:g} is below the smallest mix the candidate types allow "
                           f"({8 * smallest / sens.n_elements:.3f} bpw)")
    if widen:
        chosen, _ = solve_choices(options, budget, resolution)
        _raise(options, chosen, budget, floor)
        _fill(options, chosen, budget, floor)
    else:
        chosen, _ = solve_choices(options, budget, resolution, floor)
    types = {n: list(sens.tensors[n].nbytes)[j] for n, j in zip(names, chosen)}
    nbytes = sens.fixed_bytes + sum(sens.tensors[n].nbytes[q] for n, q in types.items())
    predicted = sum(sens.tensors[n].kld(q) for n, q in types.items())
    note = ""
    if nbytes - sens.fixed_bytes < floor:
        largest = sens.fixed_bytes + sum(max(s.nbytes.values()) for s in sens.tensors.values())
        if largest - sens.fixed_bytes < floor:
            why = f"the widest types the rows take give at most {8 * largest / sens.n_elements:.3f} bpw"
        elif widen:
            why = ("the best mix under the budget, widened, leaves no tensor a wider type that fits the rest "
                   "(a mix nearer the budget narrows other tensors instead)")
        else:
            why = "no choice of the candidate types lands between"
        bpw = 8 * nbytes / sens.n_elements
        note = f"{bpw:.3f} bpw is {bpw / budget_bpw:.1%} of the budget, below {min_fill:.0%}: {why}"
    return MixPlan(types, {n: sens.tensors[n].file_type for n in names}, nbytes, sens.n_elements, predicted,
                   exponent=exponent, budget_bpw=budget_bpw, note=note, widened=widen)


def measure_mix(meas: Measurer, types: Mapping[str, str], cancel: threading.Event | None = None,
                progress: Progress | None = None,
                memo: dict[tuple[str, str], np.ndarray] | None = None) -> float | None:
    """The real KLD of the model with these types on the measurer's tokens (the model is given back as in the file).

    `memo` keeps each (tensor, type)'s blocks for the next mix (the variants share most of their changes)."""
    memo = {} if memo is None else memo
    gguf = meas.gguf
    changed = [(n, q) for n, q in types.items() if q != GGMLType(gguf.tensors[n].qtype).name]
    try:
        for k, (name, q) in enumerate(changed):
            if cancel is not None and cancel.is_set():
                return None
            if progress is not None:
                progress(f"requantizing {name} to {q}", k / max(1, len(changed)))
            blocks = memo.get((name, q))
            if blocks is None:
                info = gguf.tensors[name]
                n_cols = int(info.shape[0])
                w = dequantize_rows(gguf.rows(name), GGMLType(info.qtype)).reshape(-1, n_cols)
                imp = meas.importance.get(name)
                blocks = meas.quantizer(w, GGMLType[q], None if imp is None else np.asarray(imp, np.float32))
                blocks = memo[(name, q)] = blocks.reshape(w.shape[0], -1)
            meas.swap(name, GGMLType[q], blocks)
        first = min((layer_of(n) for n, _ in changed), default=0)
        return meas.kld_now(-1 if first < 0 else first)
    finally:
        for name, _ in changed:
            meas.swap(name, None, None)


@dataclass
class SearchResult:
    """The chosen mix and every variant that was verified."""

    plan: MixPlan
    variants: list[MixPlan] = field(default_factory=list)
    sensitivities: Sensitivities | None = None


def search(meas: Measurer, sens: Sensitivities, budget_bpw: float, *, exponents: Sequence[float] = EXPONENTS,
           verify: bool = True, progress: Progress | None = None, cancel: threading.Event | None = None,
           min_fill: float = MIN_FILL) -> SearchResult | None:
    """Solve the budgeted choice for each exponent, verify each distinct mix, keep the best measured one."""
    say = progress or (lambda what, frac: None)
    plans: list[MixPlan] = []
    for widen in (False, True) if min_fill > 0 else (False,):
        for a in exponents:
            p = solve(sens, budget_bpw, a, min_fill=min_fill, widen=widen)
            if all(p.types != q.types for q in plans):
                plans.append(p)
    if not verify:
        return SearchResult(plans[0], plans, sens)
    if meas.base_logits is None:
        meas.base()
    checked = []
    memo: dict[tuple[str, str], np.ndarray] = {}
    for i, p in enumerate(plans):
        kld = measure_mix(meas, p.types, cancel,
                          lambda what, frac, i=i: say(f"verifying mix {i + 1} of {len(plans)}: {what}",
                                                      (i + frac) / len(plans)), memo)
        if kld is None:
            return None
        checked.append(replace(p, measured_kld=kld))
    best = min(checked, key=lambda p: p.measured_kld if p.measured_kld is not None else math.inf)
    say("mix verified", 1.0)
    return SearchResult(best, checked, sens)


def find_mix(model: Model, ids: Sequence[int], budget_bpw: float, *, importance: Mapping[str, np.ndarray] | None = None,
             quantizer: Quantizer = plain_quantizer, cache: Any = None, verify: bool = True,
             progress: Progress | None = None, cancel: threading.Event | None = None,
             group_layers: int = 1, min_fill: float = MIN_FILL) -> SearchResult | None:
    """Measure (or resume) the sensitivities, then search and verify; None if cancelled."""
    from engine.quality.sensitivity import measure_all

    say = progress or (lambda what, frac: None)
    meas = Measurer(model, ids, importance, quantizer)  # one file's run for the measurement and the verification
    sens = measure_all(model, ids, importance=importance, quantizer=quantizer, cache=cache, cancel=cancel,
                       progress=lambda what, frac: say(what, 0.8 * frac), group_layers=group_layers, meas=meas)
    if sens is None:
        return None
    return search(meas, sens, budget_bpw, verify=verify, cancel=cancel, min_fill=min_fill,
                  progress=lambda what, frac: say(what, 0.8 + 0.2 * frac))
