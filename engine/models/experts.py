"""The Mixture-of-Experts FFN: a router picks k of n experts per token, as llama.cpp's build_moe_ffn runs it.

Beside `DenseFFN` (engine.models.ffn) with the same seam: `__call__(h, ops, recorder)`, `linears()`,
`input_names()`. Op for op, in llama-graph.cpp's order:

1. router logits = ffn_gate_inp x h (a dense product), probabilities = softmax over all experts;
2. the k experts with the highest probabilities, in descending order (ggml_argsort_top_k), and their weights
   (those probabilities; renormalised where the architecture asks: divided by their sum, the sum clamped below at
   6.103515625e-5, the smallest normal float16);
3. up and gate through each chosen expert (ggml's MUL_MAT_ID: the batch grouped by expert, each expert's rows
   through the same kernels as a dense weight of that type, see `ExpertLinear`), the GLU, then down;
4. each expert's output times its weight, summed in slot order (slot 0 + slot 1 + ...);
5. Qwen2-MoE: plus a shared expert (a dense FFN) times sigmoid(ffn_gate_inp_shexp x h), computed as ggml computes
   it, silu(x) / x.

gpt-oss changes three steps: the router has a bias (added to its logits) and gates by SOFTMAX_WEIGHT (the top k
taken on the logits themselves, their weights a softmax over those k only); each expert's up, gate and down rows get
that expert's bias (ggml_add_id) after the product; the GLU is the clamped swiglu_oai.

Expert weights stay in the memory map: an expert's product is built the first time a token is routed to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from engine.kernels import isa
from engine.kernels.dispatch import TILED_MIN_ROWS, Activation, BlockProduct, compiled
from engine.kernels.activations import HAVE_NUMBA, KERNEL_LOCK
from engine.kernels.variants import early
from engine.quant.mxfp4 import refuse_infinite
from engine.quant.types import GGMLType
from engine.models.ffn import DenseFFN, GatedActivation
from engine.tensor import Linear, QTensor

if TYPE_CHECKING:
    from engine.models.weights import Weights
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
WEIGHT_SUM_MIN = np.float32(6.103515625e-5)  # build_moe_ffn's clamp of the weights' sum (norm_w)
ONE_TOKEN_COMPILED = True  # a decode step's routing and slot sum in compiled code (MoEFFN._one_token), the same bits
MAX_ONE_ROW = 64  # up to this many rows, check for the one-row-per-expert case (a decode step's) first


def _expert_gemvs() -> dict:
    """One-row kernels that have a twin running several experts' rows in one parallel region (the same bits)."""
    from engine.kernels.iquant import dot as idot  # noqa: PLC0415 - compiled kernels only
    from engine.kernels.kquant import dot, repack  # noqa: PLC0415

    return {repack.gemv_q4_k_8x8: repack.gemv_experts_q4_k_8x8, dot.gemv_q6_k: dot.gemv_experts_q6_k,
            idot.gemv_mxfp4_x8: idot.gemv_experts_mxfp4_x8}


def _expert_groups() -> dict:
    """One-row kernels whose few-rows product has a twin running every expert's rows in one parallel region
    (engine.kernels.kquant.groups, the same bits)."""
    from engine.kernels.kquant import dot, groups, repack  # noqa: PLC0415 - compiled kernels only

    return {repack.gemv_q4_k_8x8: groups.gemv_groups_q4_k_8x8, dot.gemv_q6_k: groups.gemv_groups_q6_k}


EXPERT_GEMVS: dict = _expert_gemvs() if HAVE_NUMBA else {}
EXPERT_GROUPS: dict = _expert_groups() if HAVE_NUMBA else {}


class RoutingOps(GatedActivation, Protocol):
    """What the experts FFN asks of the numerics object beyond the GLU."""

    def softmax(self, x: F32) -> F32: ...
    def silu(self, x: F32) -> F32: ...
    def sigmoid(self, x: F32) -> F32: ...


@dataclass
class ExpertLinear:
    """One 3-D expert weight, ggml shape (n_in, n_out, n_expert): expert e is rows [e*n_out, (e+1)*n_out) of the blocks.

    `rows(e, x)` is what ggml-cpu's MUL_MAT_ID computes for the rows routed to expert e: each row as the type's
    one-row product makes it (vec_dot, or the repacked gemv where llama.cpp repacks the weight), or the tiled
    k-quant kernel when 8 rows or more go to the expert; float32 numerics: the expert dequantized, times x.
    """

    weight: QTensor
    n_in: int
    n_out: int
    n_expert: int
    numerics: str = "ggml"
    _products: dict[int, BlockProduct] = field(default_factory=dict, repr=False)
    _checked: set[int] = field(default_factory=set, repr=False)

    def expert(self, e: int) -> QTensor:
        """Expert e's rows as a 2-D weight (a view of the memory map); MXFP4 blocks that make infinities are refused
        here, the first time the expert is used (a scan at load would read every expert of the file)."""
        blocks = self.weight.blocks[e * self.n_out : (e + 1) * self.n_out]
        t = QTensor(f"{self.weight.name}[{e}]", self.weight.qtype, (self.n_in, self.n_out), blocks)
        if e not in self._checked:
            if t.qtype == GGMLType.MXFP4:  # checked where first used: a scan at load would read every expert
                refuse_infinite(t.name, t.blocks)
            self._checked.add(e)
        return t

    def product(self, e: int) -> BlockProduct:
        p = self._products.get(e)
        if p is None:
            p = self._products[e] = BlockProduct(self.weight.qtype, self.expert(e).blocks, self.n_in)
        return p

    def warm_rows(self, sizes: tuple[int, ...] = (16, 2)) -> None:
        """Compile (or load) what MUL_MAT_ID runs for each number of rows routed to one expert (a band or tiled
        kernel for many, the few-rows one for two; expert 0's product is built)."""
        for m in sizes:
            ids = np.zeros(m, np.int64)
            self._into(Activation(np.zeros((m, self.n_in), np.float32)), ids, None, np.empty((m, self.n_out), np.float32))

    def __call__(self, x: F32 | Activation, ids: npt.NDArray[np.int64], src: npt.NDArray[np.int64] | None = None) -> F32:
        """Row r of the output: activation row src[r] (row r without src) through expert ids[r], the rows grouped by
        expert, experts in ascending order (MUL_MAT_ID). An Activation is quantized once for every expert (and for
        up and gate, which read the same rows): each row's bytes are what quantizing it alone gives."""
        act = x if isinstance(x, Activation) else Activation(x)
        out = np.empty((len(ids), self.n_out), np.float32)
        self._into(act, np.asarray(ids, np.int64), src, out)
        return out

    def _into(self, act: Activation, ids: npt.NDArray[np.int64], src: npt.NDArray[np.int64] | None, out: F32) -> None:
        if self.numerics == "ggml" and len(ids) <= MAX_ONE_ROW and self._one_row_each(act, ids, src, out):
            return
        order = np.argsort(ids, kind="stable")
        starts = np.flatnonzero(np.diff(ids[order], prepend=-1))
        groups = np.split(order, starts[1:])
        rows_of = (lambda sel: sel) if src is None else (lambda sel: src[sel])
        if self.numerics != "ggml":
            for sel in groups:
                out[sel] = act.x[rows_of(sel)] @ self.expert(int(ids[sel[0]])).dequantize().T
            return
        products = [self.product(int(ids[sel[0]])) for sel in groups]
        if not compiled() or any(p.gemv is None for p in products):
            for sel, p in zip(groups, products):  # the NumPy fallback: the same operands, another order of additions
                out[sel] = p(act.x[rows_of(sel)])
            return
        xq = act.bytes_for(self.weight.qtype)
        xs = np.take(xq, rows_of(order), axis=0)  # the activation rows grouped by expert: each group a slice
        grouped = np.empty((len(ids), self.n_out), np.float32)
        few: list[tuple[int, int, BlockProduct]] = []  # groups for one call of EXPERT_GROUPS' kernel
        fewest = _fewest_other(products[0])
        with KERNEL_LOCK:
            for a, sel, p in zip(starts.tolist(), groups, products):
                z = a + len(sel)
                if p.tiled is not None and z - a >= TILED_MIN_ROWS:  # mul_mat_id's tiled path, per expert
                    early(p.tiled)(p.weight, xs[a:z], grouped[a:z])
                elif z - a < fewest and p.gemv is products[0].gemv and p.weight.flags.c_contiguous:
                    few.append((a, z, p))
                elif z - a == 1:  # mul_mat_id_one_chunk (vec_dot per row) or forward_mul_mat_id (gemv per row)
                    early(p.gemv)(p.weight, xs[a], grouped[a])
                else:
                    p.gemv_rows(xs[a:z], grouped[a:z])
            if few:
                _few_rows_each(few, xs, grouped)
        out[order] = grouped

    def _one_row_each(self, act: Activation, ids: npt.NDArray[np.int64], src: npt.NDArray[np.int64] | None,
                      out: F32) -> bool:
        """A decode step's case: every expert gets one row (each row through the expert's one-row product, which is
        what the grouped path runs for a group of one), without the grouping's array work. False where it does
        not apply (an expert with several rows, no compiled kernels)."""
        experts = ids.tolist()
        if len(set(experts)) != len(experts) or not compiled():
            return False
        products = [self.product(e) for e in experts]
        if any(p.gemv is None for p in products):
            return False
        xq = act.bytes_for(self.weight.qtype)
        rows = list(range(len(experts))) if src is None else src.tolist()
        many = EXPERT_GEMVS.get(products[0].gemv) if len(products) > 1 else None
        same = many is not None and all(p.gemv is products[0].gemv and p.weight.shape == products[0].weight.shape
                                        and p.weight.dtype == products[0].weight.dtype for p in products)
        with KERNEL_LOCK:
            if same and xq.ndim == 2 and out.flags.c_contiguous:  # every expert in one parallel region
                early(many)(tuple(p.weight for p in products), xq, np.asarray(rows, np.int64), out)
                return True
            for r, (p, row) in enumerate(zip(products, rows)):  # serial twins before the late kernels (variants.early)
                early(p.gemv)(p.weight, xq[row], out[r])
        return True

    def resident_experts(self) -> list[int]:
        """The experts whose products were built (those some token was routed to)."""
        return sorted(self._products)


def _fewest_other(p: BlockProduct) -> int | float:
    """The fewest rows of one expert that its product runs through another kernel than EXPERT_GROUPS' (the band
    kernel of repacked Q4_K; the tiled path of the others); 0 where the product has no such twin, or before the
    late kernels may run (EXPERT_GROUPS' are late kernels: the late helper compiles them through warm_rows)."""
    from engine.kernels import paths, precompile  # noqa: PLC0415 - compiled kernels only

    if EXPERT_GROUPS.get(p.gemv) is None or p.weight.dtype != np.uint8 or p.weight.ndim != 2:
        return 0
    if not precompile.late_ready():
        return 0
    if p.path == "repack_8x8":
        least = getattr(paths.q4_k_rows(), "least", None)
        return least if least is not None else float("inf")
    return TILED_MIN_ROWS if p.tiled is not None else float("inf")


def _few_rows_each(few: list[tuple[int, int, BlockProduct]], xs: npt.NDArray[np.uint8], grouped: F32) -> None:
    """Groups of rows (a, z, expert's product), each through its expert's few-rows product, in one call of the
    EXPERT_GROUPS kernel (its rows gathered into one run first); the caller holds KERNEL_LOCK."""
    from engine.kernels.kquant.groups import addresses  # noqa: PLC0415 - compiled kernels only

    sizes = np.array([z - a for a, z, _ in few], np.int64)
    starts = np.zeros(len(few) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    rows = np.concatenate([np.arange(a, z) for a, z, _ in few])
    contiguous = rows[0] == 0 and len(rows) == xs.shape[0]  # every group is here: the rows as they are
    x = xs if contiguous else np.ascontiguousarray(xs[rows])
    out = grouped if contiguous else np.empty((len(rows), grouped.shape[1]), np.float32)
    first = few[0][2]
    kernel = EXPERT_GROUPS[first.gemv]
    kernel(addresses([p.weight for _, _, p in few]), np.int64(first.weight.shape[0]), np.int64(first.weight.shape[1]),
           x, starts, out)
    if not contiguous:
        grouped[rows] = out


@dataclass
class Routing:
    """One layer's routing of a batch: per token the chosen experts (descending probability), their weights, and
    the router's probabilities over all experts."""

    experts: npt.NDArray[np.int32]  # (T, k)
    weights: F32  # (T, k)
    probs: F32  # (T, n_expert)


def route(logits: F32, k: int, ops: RoutingOps, normalize: bool, gating: str = "softmax",
          display: bool = True) -> Routing:
    """softmax, the top k (ties to the lower index), their probabilities, renormalised when asked. gating
    'softmax_weight' (gpt-oss): the top k of the logits, weighted by a softmax over those k; `probs` is then the
    softmax over all experts, for display only (the graph never computes it): with display False (nothing records
    the routing) it is left empty."""
    logits = np.ascontiguousarray(logits, np.float32)
    weighted = gating == "softmax_weight"
    probs = ops.softmax(logits) if display or not weighted else np.zeros((logits.shape[0], 0), np.float32)
    score = logits if weighted else probs
    order = np.argsort(-score, axis=-1, kind="stable")[:, :k].astype(np.int32)
    weights = np.take_along_axis(score, order, axis=-1)
    if gating == "softmax_weight":  # ggml_soft_max over the k chosen logits of each token
        weights = ops.softmax(np.ascontiguousarray(weights))
    if normalize:  # ggml_sum_rows (a double sum in order, rounded once), ggml_clamp, ggml_div
        total = np.cumsum(weights.astype(np.float64), axis=-1)[:, -1].astype(np.float32)
        weights = weights / np.maximum(total, WEIGHT_SUM_MIN)[:, None]
    return Routing(order, weights.astype(np.float32), probs)


@dataclass
class MoEFFN:
    """The experts FFN of one layer (see the module docstring); `shared` and `shared_gate` for Qwen2-MoE."""

    router: Linear  # ffn_gate_inp: n_embd -> n_expert
    up: ExpertLinear  # ffn_up_exps, or ffn_gate_up_exps (gate rows then up rows) when `fused_gate_up`
    gate: ExpertLinear | None  # None: silu(up) (a llama MoE file without ffn_gate_exps), or the fused product's
    down: ExpertLinear
    n_used: int
    normalize: bool
    glu: str = "swiglu"
    layer: int = 0
    shared: DenseFFN | None = None
    shared_gate: Linear | None = None  # ffn_gate_inp_shexp: n_embd -> 1
    gating: str = "softmax"  # 'softmax' or 'softmax_weight' (gpt-oss), see `route`
    router_bias: F32 | None = None  # gpt-oss: ffn_gate_inp.bias (n_expert,)
    up_bias: F32 | None = None  # gpt-oss: each expert's bias rows (n_expert, width), added by ggml_add_id
    gate_bias: F32 | None = None
    down_bias: F32 | None = None
    ablated_experts: npt.NDArray[np.int64] | None = None  # never chosen: their logits -inf (engine.intervene.ablation)
    shared_sigmoid: str = "silu_div"  # the shared expert's gate: qwen2moe's silu(x) / x, or ggml_sigmoid (qwen35moe)
    fused_gate_up: bool = False  # `up` is ffn_gate_up_exps: one product per expert, split into gate and up (views)

    def input_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The dense matrices each recorded input feeds (the router's); the experts' inputs, which depend on the
        routing, are not recorded (an importance matrix per expert is not made yet)."""
        shared = (self.shared_gate.weight.name,) if self.shared_gate is not None else ()
        return (self.router.weight.name, *shared), ()

    def __call__(self, h: F32, ops: RoutingOps, recorder: Recorder | None = None) -> F32:  # type: ignore[override]
        t, k = h.shape[0], self.n_used
        if recorder is not None:
            recorder.record_input(self.input_names()[0], h)
        logits = self.router(h)
        if self.router_bias is not None:
            logits = logits + self.router_bias
        if self.ablated_experts is not None:  # as a router bias of -inf would: never among the top k
            logits = logits.copy()
            logits[:, self.ablated_experts] = -np.inf
        if t == 1 and recorder is None and ONE_TOKEN_COMPILED and self.up.numerics == "ggml" and compiled():
            out = self._one_token(h, logits, ops)
        else:
            r = route(logits, k, ops, self.normalize, self.gating, display=recorder is not None)
            if recorder is not None:
                recorder.record_routing(self.layer, r.experts, r.weights, r.probs)
            ids = r.experts.reshape(-1).astype(np.int64)  # slot-major per token: (token, slot) rows
            down = self._experts(h, ids, np.repeat(np.arange(t), k), ops)  # each token's row once per chosen expert
            y = down.reshape(t, k, -1) * r.weights[:, :, None]  # ggml_mul by the weights
            out = y[:, 0].copy()
            for s in range(1, k):  # ggml_add of the slots' views, one after another
                out = out + y[:, s]
        if self.shared is not None and self.shared_gate is not None:
            z = self.shared_gate(h)  # (T, 1)
            if self.shared_sigmoid == "sigmoid":  # qwen35moe.cpp, qwen3next.cpp: ggml_sigmoid
                gate = ops.sigmoid(z)
            else:
                with np.errstate(invalid="ignore", divide="ignore"):
                    gate = ops.silu(z) / z  # qwen2moe.cpp's sigmoid: ggml_div(ggml_silu(x), x)
            out = out + self.shared(h, ops, recorder) * gate
        return out.astype(np.float32, copy=False)

    def _one_token(self, h: F32, logits: F32, ops: RoutingOps) -> F32:
        """A decode step's experts FFN (one token, nothing recorded, compiled kernels): the routing and the weighted
        sum of the slots in compiled code (engine.ops.moe_kernels, the same bits as `route` and the NumPy sum)."""
        from engine.ops.moe_kernels import ROUTE_ONE, combine  # noqa: PLC0415 - compiled kernels only

        k = self.n_used
        ids, weights = np.empty(k, np.int64), np.empty(k, np.float32)
        ROUTE_ONE[isa.w8()](np.ascontiguousarray(logits[0], np.float32), k, self.normalize,
                            self.gating == "softmax_weight", ids, weights)
        down = np.ascontiguousarray(self._experts(h, ids, np.zeros(k, np.int64), ops), np.float32)
        out = np.empty((1, down.shape[1]), np.float32)
        combine(down, weights, out[0])
        return out

    def _experts(self, h: F32, ids: npt.NDArray[np.int64], src: npt.NDArray[np.int64], ops: RoutingOps) -> F32:
        """Row r: activation row src[r] through expert ids[r]'s up and gate, the GLU, then its down (with gpt-oss's
        biases); h quantized once for up, gate and every expert."""
        act = Activation(h)
        if self.fused_gate_up:  # build_moe_ffn's merged path: one mul_mat_id, then views of its gate and up halves
            gu = self.up(act, ids, src)
            width = gu.shape[-1] // 2
            return self.down(ops.glu(self.glu, gu[:, :width], gu[:, width:]), ids)
        up = _biased(self.up(act, ids, src), self.up_bias, ids)
        if self.gate is not None:
            g = ops.glu(self.glu, _biased(self.gate(act, ids, src), self.gate_bias, ids), up)
        else:
            g = ops.silu(up)
        return _biased(self.down(g, ids), self.down_bias, ids)

    @property
    def gate_up(self) -> None:
        """No fused gate/up product: the experts are multiplied per expert (Layer.fused skips it)."""
        return None

    def linears(self) -> list[Linear]:
        """The dense matrices of the layer's FFN (the router, the shared expert's); experts are in `experts()`."""
        dense = [self.router]
        if self.shared is not None and self.shared_gate is not None:
            dense += [self.shared_gate, *self.shared.linears()]
        return dense

    def experts(self) -> list[ExpertLinear]:
        return [self.up, *([self.gate] if self.gate is not None else []), self.down]


def _biased(rows: F32, bias: F32 | None, ids: npt.NDArray[np.int64]) -> F32:
    """ggml_add_id: row r plus the bias row of its expert ids[r]."""
    return rows if bias is None else rows + bias[ids]


def load_moe(model: Any, w: Weights, i: int, a: Any) -> MoEFFN:
    """Block i's experts FFN under llama.cpp's names (ffn_gate_inp, ffn_{gate,up,down}_exps; Qwen2-MoE's *_shexp)."""
    b = f"blk.{i}."
    n, width = a.n_expert, a.expert_hidden
    router = w.linear(b + "ffn_gate_inp.weight", a.dim, n)
    fused = model.fused_gate_up_exps and w.has(b + "ffn_gate_up_exps.weight")  # create_tensor_gate_up_exps
    if fused:  # gate rows then up rows of each expert (convert_hf_to_gguf.py --fuse-gate-up-exps)
        up, gate = w.experts(b + "ffn_gate_up_exps.weight", a.dim, 2 * width, n), None
    else:
        up = w.experts(b + "ffn_up_exps.weight", a.dim, width, n)
        gate = w.experts(b + "ffn_gate_exps.weight", a.dim, width, n) if w.has(b + "ffn_gate_exps.weight") else None
    down = w.experts(b + "ffn_down_exps.weight", width, a.dim, n)
    shared = shared_gate = None
    if model.shared_expert:  # qwen2moe.cpp: n_ff_shexp, else n_ff
        sw = a.shared_hidden or a.hidden_dim
        parts = [w.linear(b + "ffn_gate_shexp.weight", a.dim, sw), w.linear(b + "ffn_up_shexp.weight", a.dim, sw)]
        shared = DenseFFN(parts, w.linear(b + "ffn_down_shexp.weight", sw, a.dim), "swiglu")
        shared_gate = w.linear(b + "ffn_gate_inp_shexp.weight", a.dim, 1)
    ffn = MoEFFN(router, up, gate, down, a.n_expert_used, model.moe_normalize, model.glu, i, shared, shared_gate,
                 model.moe_gating, shared_sigmoid=model.shared_sigmoid, fused_gate_up=fused)
    if model.expert_biases:  # gpt-oss: the router's and every expert's biases, all required
        ffn.router_bias = w.vector(b + "ffn_gate_inp.bias", n)
        ffn.up_bias = w.qtensor(b + "ffn_up_exps.bias", (width, n)).dequantize().reshape(n, width)
        ffn.gate_bias = w.qtensor(b + "ffn_gate_exps.bias", (width, n)).dequantize().reshape(n, width)
        ffn.down_bias = w.qtensor(b + "ffn_down_exps.bias", (a.dim, n)).dequantize().reshape(n, a.dim)
    return ffn
