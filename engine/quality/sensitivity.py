"""How much each tensor's quantization hurts: the KLD to the file when that tensor alone is requantized.

A direct measurement of every (tensor, type) pair would cost one forward pass each (SmolLM2: 211
tensors x 6 types). Instead each tensor is measured once, at a probe type near 4 bits per weight,
and the other types are scaled from it by their weighted squared error, which costs only a
quantize/dequantize:

    KLD_t(q) ~= KLD_t(probe) * E_t(q) / E_t(probe),   E_t(q) = sum_j w_j * sum_i (W'_ij - W_ij)^2

with w_j the importance of input column j (the imatrix's mean squared activation; 1 without one).
KLD is quadratic in a small perturbation of the weights, so it is linear in E. A tensor inside a
block is measured by running only the layers from its own on, starting from the residual stream the
file's run left there (the layers before it are unchanged): half a forward pass on average. A tensor
outside the blocks (the embeddings, the output head) takes a whole pass. The file's own type costs
nothing (its bytes are kept, as llama-quantize keeps a tensor whose type does not change).
"""
from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.errors import SettingError
from engine.quality.compare import kld_rows
from engine.quant import dequantize_rows, quantize
from engine.quant.rules import keep_reason
from engine.quant.types import TYPES, GGMLType
from engine.tensor import QTensor

if TYPE_CHECKING:
    from engine.model import Model
    from engine.quality.sensitivity_cache import SensitivityCache

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]
# quantize(float32 rows, type, importance of each column or None) -> blocks; the imatrix path plugs in here
Quantizer = Callable[[npt.NDArray[np.float32], GGMLType, "npt.NDArray[np.float32] | None"], npt.NDArray[np.uint8]]

_T = GGMLType
# the types a searched mix may give a tensor (those llama-quantize and GGUF Lens both write)
CANDIDATE_TYPES: tuple[GGMLType, ...] = (
    _T.Q2_K, _T.Q3_K, _T.Q4_0, _T.Q4_1, _T.Q4_K, _T.Q5_0, _T.Q5_1, _T.Q5_K, _T.Q6_K, _T.Q8_0,
)
PROBE_BPW = 4.0  # each tensor's KLD is measured at the candidate nearest this many bits per weight
MAX_TOKENS = 256  # calibration tokens run in one batch (the base run and the tails must batch alike)


def plain_quantizer(x: npt.NDArray[np.float32], qtype: GGMLType, importance: npt.NDArray[np.float32] | None) -> npt.NDArray[np.uint8]:
    """quantize(), with the importance as llama-quantize's --imatrix quant_weights when there is one."""
    if importance is None:
        return quantize(x, qtype)
    return quantize(x, qtype, importance)  # type: ignore[call-arg]


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
        self.base_logp: np.ndarray | None = None
        from engine.quality.requantize import Requantizer

        self._setters = Requantizer(model)._setters()  # how to swap a tensor's blocks into the model

    def _run(self, x: np.ndarray, first: int, keep_inputs: bool = False) -> np.ndarray:
        """log-softmax of the logits after running layers [first, L) on residual stream x (as forward does)."""
        from engine.generate import log_softmax
        from engine.models.decoder import attention_rounding

        net = self.net
        cache = net.new_cache(max(len(self.ids), 16))
        cache.reserve(len(self.ids))
        net._rounding = attention_rounding(cache.qtype) if net.numerics == "ggml" else (None, None)
        net.select_rope(cache.n_ctx)
        for i in range(first, net.args.n_layers):
            if keep_inputs:
                self.inputs.append(x)
            x = net.run_layers(x, 0, cache, None, range(i, i + 1))
        return log_softmax(net.head(x, True)).astype(np.float64)

    def base(self) -> None:
        """The file's own run: the reference distributions and each layer's input."""
        self.inputs = []
        self.base_logp = self._run(self.net.embed(self.ids), 0, keep_inputs=True)

    def kld_now(self, first: int) -> float:
        """Mean KLD(file || model as it is now) when only layers from `first` on differ (-1: the whole model)."""
        assert self.base_logp is not None
        if first < 0:
            logp = self._run(self.net.embed(self.ids), 0)
        else:
            logp = self._run(self.inputs[first], first)
        return float(np.maximum(kld_rows(self.base_logp[:-1], logp[:-1]), 0.0).mean())

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
        nbytes: dict[str, int] = {}
        error: dict[str, float] = {}
        blocks_of: dict[GGMLType, np.ndarray] = {}
        for q in candidate_types(n_cols, file_type):
            if cancel is not None and cancel.is_set():
                return None
            nbytes[q.name] = n_rows * TYPES[q].row_bytes(n_cols)
            if q == file_type:
                error[q.name] = 0.0
                continue
            blocks = self.quantizer(w, q, None if imp is None else np.asarray(imp, np.float32))
            d = dequantize_rows(blocks.reshape(n_rows, -1), q).reshape(n_rows, n_cols) - w
            sq = np.einsum("ij,ij->j", d, d, dtype=np.float64)
            error[q.name] = float(sq @ col_w) if col_w is not None else float(sq.sum())
            blocks_of[q] = blocks
        if not blocks_of or name not in self._setters:
            probe, blocks = file_type, None
        else:
            probe = min(blocks_of, key=lambda q: (abs(TYPES[q].bits_per_weight - PROBE_BPW), -TYPES[q].bits_per_weight))
            blocks = blocks_of[probe].reshape(n_rows, -1)
        s = TensorSensitivity(name, layer_of(name), n_rows * n_cols, file_type.name, probe.name, 0.0, nbytes, error)
        return s, blocks

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
    quantizer: Quantizer = plain_quantizer, cache: SensitivityCache | None = None,
    progress: Progress | None = None, cancel: threading.Event | None = None, group_layers: int = 1,
) -> Sensitivities | None:
    """Every quantizable tensor's sensitivity, resuming from `cache` and saving to it as it goes; None if cancelled."""
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
        meas = Measurer(model, ids, importance, quantizer)
        meas.base()
        k = 0
        for group in groups_of(todo, group_layers):
            if cancel is not None and cancel.is_set():
                return None
            say(f"tensor {resumed + k + 1} of {len(names)}: {', '.join(group)}", (resumed + k) / len(names))
            got = meas.measure_group(group, cancel)
            if got is None:
                return None
            done.update((s.name, s) for s in got)
            k += len(group)
            if cache is not None:
                cache.save(done)
    say("sensitivities measured", 1.0)
    return Sensitivities({n: done[n] for n in names}, fixed, n_elements, len(ids), resumed, notes)
