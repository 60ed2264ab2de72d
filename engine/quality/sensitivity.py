"""How much each tensor's quantization hurts: the KLD to the file when that tensor alone is requantized.

A direct measurement of every (tensor, type) pair would cost one forward pass each (SmolLM2: 211
tensors x 6 types). Instead each tensor is measured once, at a probe type near 4 bits per weight,
and the other types are scaled from it by their weighted squared error, which costs only a
quantize/dequantize:

    KLD_t(q) ~= KLD_t(probe) * E_t(q) / E_t(probe),   E_t(q) = sum_j w_j * sum_i (W'_ij - W_ij)^2

with w_j the importance of input column j (the imatrix's mean squared activation; 1 without one).
KLD is quadratic in a small perturbation of the weights, so it is linear in E. Only E's ratios enter,
so the types other than the probe are quantized on an even sample of the rows (SAMPLE_ROWS; the
probe, which goes into the model, on all of them). A tensor inside a
block is measured by running only the layers from its own on, starting from the residual stream the
file's run left there (the layers before it are unchanged): half a forward pass on average. A tensor
outside the blocks (the embeddings, the output head) takes a whole pass. The KLD is formed from the
logits' difference (kld_from_logits), not from two log-softmaxes. The file's own type costs nothing
(its bytes are kept, as llama-quantize keeps a tensor whose type does not change).
"""
from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from engine.errors import SettingError
from engine.quant import dequantize_rows, quantize
from engine.quant.rules import keep_reason
from engine.quant.types import TYPES, GGMLType
from engine.tensor import QTensor

if TYPE_CHECKING:
    from engine.model import Model

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]
# quantize(float32 rows, type, importance of each column or None) -> blocks; the imatrix path plugs in here
Quantizer = Callable[[npt.NDArray[np.float32], GGMLType, "npt.NDArray[np.float32] | None"], npt.NDArray[np.uint8]]

_T = GGMLType
# the types a searched mix may give a tensor (those llama-quantize and GGUF Lens both write); F16 is the one
# wider than Q8_0 that every row takes: without it a budget between "the rest at Q8_0" and the next step of a
# big tensor (Gemma 3's 640-wide embedding: Q5_1 or Q8_0 only) cannot be reached within 1%
CANDIDATE_TYPES: tuple[GGMLType, ...] = (
    _T.Q2_K, _T.Q3_K, _T.Q4_0, _T.Q4_1, _T.Q4_K, _T.Q5_0, _T.Q5_1, _T.Q5_K, _T.Q6_K, _T.Q8_0, _T.F16,
)
PROBE_BPW = 4.0  # each tensor's KLD is measured at the candidate nearest this many bits per weight
MAX_TOKENS = 256  # calibration tokens run in one batch (the base run and the tails must batch alike)
SAMPLE_ROWS = 128  # rows of a tensor the non-probe candidates' errors are measured on (their ratio to the probe's)
PREPARE_THREADS = 2  # threads quantizing the candidates of the tensors ahead (the numba quantizers drop the GIL)
PREPARE_AHEAD = 4  # tensors prepared ahead of the one being run


def plain_quantizer(x: npt.NDArray[np.float32], qtype: GGMLType, importance: npt.NDArray[np.float32] | None) -> npt.NDArray[np.uint8]:
    """quantize(), with the importance as llama-quantize's --imatrix quant_weights when there is one."""
    if importance is None:
        return quantize(x, qtype)
    return quantize(x, qtype, importance)  # type: ignore[call-arg]


def softmax32(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Probabilities per row (computed in float64, kept as float32)."""
    x = np.asarray(logits, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def kld_from_logits(p: npt.NDArray[np.float32], z0: npt.NDArray[np.float32],
                    z: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """KL(softmax(z0) || softmax(z)) per row, p = softmax(z0), from the logits' difference d = z0 - z:

        KL = E_p[d] + log E_p[exp(-d)]

    Both terms are of the size of d and their sum of its square, so d is formed first (in float32, exact
    for close logits) and both expectations are summed in float64: as close to log-softmax in float64 as
    the measurement needs, in a few passes over float32 arrays instead of many over float64 ones.
    """
    d = np.subtract(z0, z, dtype=np.float32)
    shift = d.min(axis=-1, keepdims=True)  # exp(shift - d) <= 1: no overflow
    e = np.exp(np.subtract(shift, d, dtype=np.float32))
    mean_d = np.einsum("ij,ij->i", p, d, dtype=np.float64)
    mean_e = np.einsum("ij,ij->i", p, e, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = mean_d + np.log(mean_e) - shift[:, 0].astype(np.float64)
    bad = ~np.isfinite(out)  # logits so far apart that exp underflowed where p lives: log-softmax in float64
    if bad.any():
        a64, b64 = np.asarray(z0[bad], np.float64), np.asarray(z[bad], np.float64)
        la = a64 - a64.max(-1, keepdims=True)
        la -= np.log(np.exp(la).sum(-1, keepdims=True))
        lb = b64 - b64.max(-1, keepdims=True)
        lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
        out[bad] = np.sum(np.exp(la) * (la - lb), axis=-1)
    return out


def candidate_types(n_cols: int, file_type: GGMLType) -> list[GGMLType]:
    """The types whose blocks divide a row of n_cols (a 576-wide row takes no 256-wide k-quant), and the file's own."""
    out = [q for q in CANDIDATE_TYPES if n_cols % TYPES[q].block_size == 0]
    if file_type not in out:
        out.append(file_type)
    return sorted(out, key=lambda q: TYPES[q].bits_per_weight)


def layer_of(name: str) -> int:
    """The block a tensor belongs to, -1 outside the blocks."""
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


@dataclass
class TensorSensitivity:
    """One tensor's measured KLD at the probe type and every candidate's size and weighted error."""

    name: str
    layer: int
    n_elements: int
    file_type: str
    probe: str
    probe_kld: float
    nbytes: dict[str, int]  # bytes of the tensor in each candidate type
    error: dict[str, float]  # weighted squared error of each candidate type against the file's weights

    def kld(self, qtype: str) -> float:
        """The KLD this tensor alone adds when stored as qtype (0 for the file's own type)."""
        if qtype == self.file_type:
            return 0.0
        e_probe = self.error[self.probe]
        if e_probe <= 0.0:
            return 0.0
        return max(0.0, self.probe_kld) * self.error[qtype] / e_probe

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layer": self.layer, "n_elements": self.n_elements, "file_type": self.file_type,
                "probe": self.probe, "probe_kld": self.probe_kld, "nbytes": self.nbytes, "error": self.error}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorSensitivity:
        """Rebuild from as_dict(); ValueError/KeyError/TypeError on a malformed entry."""
        s = cls(str(d["name"]), int(d["layer"]), int(d["n_elements"]), str(d["file_type"]), str(d["probe"]),
                float(d["probe_kld"]), {str(k): int(v) for k, v in d["nbytes"].items()},
                {str(k): float(v) for k, v in d["error"].items()})
        if s.probe not in s.error or set(s.nbytes) != set(s.error) or not all(math.isfinite(v) for v in s.error.values()):
            raise ValueError(f"{s.name}: inconsistent sensitivity entry")
        GGMLType[s.file_type]
        return s


class SensitivityStore(Protocol):
    """Where measured tensors are kept between runs (engine.quality.sensitivity_cache.SensitivityCache)."""

    def load(self) -> tuple[dict[str, TensorSensitivity], str | None]: ...
    def save(self, tensors: Mapping[str, TensorSensitivity]) -> None: ...


@dataclass
class Sensitivities:
    """Every quantizable tensor's sensitivity, and the sizes of the tensors a mix cannot change."""

    tensors: dict[str, TensorSensitivity]
    fixed_bytes: int  # norms and other tensors llama-quantize keeps as they are
    n_elements: int  # every tensor's weights (the denominator of bits per weight)
    n_tokens: int
    resumed: int = 0  # how many tensors came from the cache
    notes: list[str] = field(default_factory=list)


class Measurer:
    """Runs a model on calibration tokens once, then measures tensors one at a time against that run."""

    def __init__(self, model: Model, ids: Sequence[int], importance: Mapping[str, np.ndarray] | None = None,
                 quantizer: Quantizer = plain_quantizer):
        if len(ids) < 2:
            raise SettingError("the calibration text needs at least 2 tokens")
        if len(ids) > MAX_TOKENS:
            raise SettingError(f"the calibration text is {len(ids)} tokens; use at most {MAX_TOKENS}")
        self.model, self.net, self.gguf = model, model.net, model.gguf
        self.ids = np.asarray(ids, np.int64)
        self.importance = importance or {}
        self.quantizer = quantizer
        self.inputs: list[np.ndarray] = []  # the residual stream entering each layer on the file's run
        self.base_logits: np.ndarray | None = None  # the file's logits (float32), and its probabilities
        self.base_p: np.ndarray | None = None
        from engine.quality.requantize import Requantizer

        self._setters = Requantizer(model)._setters()  # how to swap a tensor's blocks into the model

    def _run(self, x: np.ndarray, first: int, keep_inputs: bool = False) -> np.ndarray:
        """The logits (float32) of every position but the last after running layers [first, L) on residual
        stream x (as forward does); the last position predicts no token of the text."""
        net = self.net
        cache = net.new_cache(max(len(self.ids), 16))
        cache.reserve(len(self.ids))
        net.begin(cache)
        for i in range(first, net.args.n_layers):
            if keep_inputs:
                self.inputs.append(x)
            x = net.run_layers(x, 0, cache, None, range(i, i + 1))
        return np.asarray(net.head(x[:-1], True), np.float32)

    def base(self) -> None:
        """The file's own run: the reference distributions and each layer's input."""
        self.inputs = []
        self.base_logits = self._run(self.net.embed(self.ids), 0, keep_inputs=True)
        self.base_p = softmax32(self.base_logits)

    def kld_now(self, first: int) -> float:
        """Mean KLD(file || model as it is now) when only layers from `first` on differ (-1: the whole model)."""
        assert self.base_logits is not None and self.base_p is not None
        if first < 0:
            logits = self._run(self.net.embed(self.ids), 0)
        else:
            logits = self._run(self.inputs[first], first)
        return float(np.maximum(kld_from_logits(self.base_p, self.base_logits, logits), 0.0).mean())

    def swap(self, name: str, qtype: GGMLType | None, blocks: np.ndarray | None) -> None:
        """Put blocks of qtype into the model for this tensor (None: the file's blocks back)."""
        info = self.gguf.tensors[name]
        for shape, put in self._setters[name]:
            if qtype is None:
                put(QTensor(name, GGMLType(info.qtype), shape, self.gguf.rows(name)))
            else:
                put(QTensor(name, qtype, shape, blocks))

    def prepare(self, name: str, cancel: threading.Event | None = None) -> tuple[TensorSensitivity, np.ndarray | None] | None:
        """One tensor's candidates (size, weighted error) and its probe's blocks, the KLD not yet measured."""
        info = self.gguf.tensors[name]
        shape = tuple(int(s) for s in info.shape)
        n_cols, n_rows = shape[0], math.prod(shape[1:])
        file_type = GGMLType(info.qtype)
        w = dequantize_rows(self.gguf.rows(name), file_type).reshape(n_rows, n_cols)
        imp = self.importance.get(name)
        col_w = np.asarray(imp, np.float64).reshape(-1) if imp is not None and np.size(imp) == n_cols else None
        qw = None if imp is None else np.asarray(imp, np.float32)
        types = candidate_types(n_cols, file_type)
        nbytes = {q.name: n_rows * TYPES[q].row_bytes(n_cols) for q in types}
        others = [q for q in types if q != file_type]
        if not others or name not in self._setters:  # nothing to measure: the file's own type only
            error = {q.name: 0.0 if q == file_type else self._error(w, q, qw, col_w)[0] for q in types}
            return TensorSensitivity(name, layer_of(name), n_rows * n_cols, file_type.name, file_type.name, 0.0,
                                     nbytes, error), None
        probe = min(others, key=lambda q: (abs(TYPES[q].bits_per_weight - PROBE_BPW), -TYPES[q].bits_per_weight))
        e_probe, blocks = self._error(w, probe, qw, col_w)  # the probe goes into the model: every row
        # the other types' errors only enter as ratios to the probe's (KLD ~ E): measured on a sample of rows
        sample = np.unique(np.linspace(0, n_rows - 1, min(n_rows, SAMPLE_ROWS)).astype(np.int64))
        ws = w[sample] if len(sample) < n_rows else w
        e_probe_s = self._error(ws, probe, qw, col_w)[0] if len(sample) < n_rows else e_probe
        error = {file_type.name: 0.0, probe.name: e_probe}
        for q in others:
            if cancel is not None and cancel.is_set():
                return None
            if q != probe:
                e = self._error(ws, q, qw, col_w)[0]
                error[q.name] = e * (e_probe / e_probe_s) if e_probe_s > 0 else e * n_rows / len(sample)
        s = TensorSensitivity(name, layer_of(name), n_rows * n_cols, file_type.name, probe.name, 0.0, nbytes,
                              {q.name: error[q.name] for q in types})
        return s, blocks.reshape(n_rows, -1)

    def _error(self, w: np.ndarray, q: GGMLType, qw: np.ndarray | None,
               col_w: np.ndarray | None) -> tuple[float, np.ndarray]:
        """(the weighted squared error of rows w quantized to q, the blocks)."""
        blocks = self.quantizer(w, q, qw)
        d = dequantize_rows(blocks.reshape(len(w), -1), q).reshape(w.shape) - w
        sq = np.einsum("ij,ij->j", d, d, dtype=np.float64)
        return (float(sq @ col_w) if col_w is not None else float(sq.sum())), blocks

    def measure_group(self, names: Sequence[str], cancel: threading.Event | None = None) -> list[TensorSensitivity] | None:
        """Tensors measured together: all at their probe types in one run, the KLD shared by their probe errors.

        One tensor alone is the exact measurement; a group (one role in a few neighbouring layers) costs one
        run instead of several and assumes its tensors matter alike per unit of weighted error.
        """
        prepared = []
        for name in names:
            got = self.prepare(name, cancel)
            if got is None:
                return None
            prepared.append(got)
        return self.measure_prepared(prepared)

    def measure_prepared(self, prepared: Sequence[tuple[TensorSensitivity, np.ndarray | None]]) -> list[TensorSensitivity]:
        """measure_group on tensors already prepared (prepare() may run ahead on other threads)."""
        probed = [(s, b) for s, b in prepared if b is not None]
        if not probed:
            return [s for s, _ in prepared]
        try:
            for s, b in probed:
                self.swap(s.name, GGMLType[s.probe], b)
            first = min(s.layer for s, _ in probed)
            kld = self.kld_now(-1 if first < 0 else first)
        finally:
            for s, _ in probed:
                self.swap(s.name, None, None)
        total = sum(s.error[s.probe] for s, _ in probed)
        for s, _ in probed:
            s.probe_kld = kld * (s.error[s.probe] / total if total > 0 else 1.0 / len(probed))
        return [s for s, _ in prepared]

    def measure(self, name: str, cancel: threading.Event | None = None) -> TensorSensitivity | None:
        """One tensor: every candidate's size and weighted error, and the KLD at the probe type; None if cancelled."""
        got = self.measure_group([name], cancel)
        return None if got is None else got[0]


def groups_of(names: Sequence[str], group_layers: int) -> list[list[str]]:
    """Tensors measured together: one role in `group_layers` neighbouring blocks; tensors outside blocks alone."""
    if group_layers <= 1:
        return [[n] for n in names]
    out: dict[tuple[str, int], list[str]] = {}
    for n in names:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", n)
        key = (n, -1) if m is None else (m.group(2), int(m.group(1)) // group_layers)
        out.setdefault(key, []).append(n)
    return list(out.values())


def quantizable_tensors(model: Model) -> tuple[list[str], int, int]:
    """(names a mix may change, bytes of the others, every tensor's weight count), in file order."""
    names, fixed, n = [], 0, 0
    for name, info in model.gguf.tensors.items():
        shape = tuple(int(s) for s in info.shape)
        n += math.prod(shape)
        if keep_reason(name, shape) is None:
            names.append(name)
        else:
            fixed += int(info.nbytes)
    return names, fixed, n


def measure_all(
    model: Model, ids: Sequence[int], *, importance: Mapping[str, np.ndarray] | None = None,
    quantizer: Quantizer = plain_quantizer, cache: SensitivityStore | None = None,
    progress: Progress | None = None, cancel: threading.Event | None = None, group_layers: int = 1,
    meas: Measurer | None = None,
) -> Sensitivities | None:
    """Every quantizable tensor's sensitivity, resuming from `cache` and saving to it as it goes; None if cancelled.

    `meas` (made here when not given) keeps the file's run for the caller (the verification reuses it)."""
    say = progress or (lambda what, frac: None)
    names, fixed, n_elements = quantizable_tensors(model)
    if not names:
        raise SettingError("the model has no tensor a mix could change")
    done: dict[str, TensorSensitivity] = {}
    notes: list[str] = []
    if cache is not None:
        done, note = cache.load()
        done = {k: v for k, v in done.items() if k in names}
        if note:
            notes.append(note)
    resumed = len(done)
    todo = [n for n in names if n not in done]
    say(f"measuring the file's run ({resumed} of {len(names)} tensors from the cache)", 0.0)
    if todo:
        if meas is None:
            meas = Measurer(model, ids, importance, quantizer)
        if meas.base_logits is None:
            meas.base()
        groups = groups_of(todo, group_layers)
        order = iter([n for g in groups for n in g])
        stop = threading.Event()

        def prep(name: str) -> tuple[TensorSensitivity, np.ndarray | None] | None:
            return None if stop.is_set() else meas.prepare(name, stop)

        # the candidates of the next tensors are quantized on worker threads while a tensor's run goes on
        with ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="mix-prepare") as pool:
            ahead: dict[str, Future[Any]] = {}
            try:
                k = 0
                for group in groups:
                    prepared = []
                    for name in group:
                        while name not in ahead or len(ahead) < PREPARE_AHEAD:
                            nxt = next(order, None)
                            if nxt is None:
                                break
                            ahead[nxt] = pool.submit(prep, nxt)
                        if cancel is not None and cancel.is_set():
                            return None
                        got = ahead.pop(name).result()
                        if got is None:
                            return None
                        prepared.append(got)
                    say(f"tensor {resumed + k + 1} of {len(names)}: {', '.join(group)}", (resumed + k) / len(names))
                    done.update((s.name, s) for s in meas.measure_prepared(prepared))
                    k += len(group)
                    if cache is not None:
                        cache.save(done)
            finally:
                stop.set()  # the tensors not started yet are skipped; a running one ends at its next type
    say("sensitivities measured", 1.0)
    return Sensitivities({n: done[n] for n in names}, fixed, n_elements, len(ids), resumed, notes)
