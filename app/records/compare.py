"""Records of the Compare view and the requantize tasks: frozen dataclasses of numpy arrays, made on the worker.

Nothing here imports Qt or holds an engine object; the statistics themselves come from engine.quality.compare
(token_stats, layer_divergence), this module only packs them with what the view draws (top-k tokens
per position, the heads of both runs, the preset sweep's points).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import numpy.typing as npt

from app.records.attention import HeadRecord
from engine.quality.compare import Comparison

F32 = npt.NDArray[np.float32]
TOP_K = 10
CACHE_TYPES = ("F32", "F16", "Q8_0", "Q4_0")  # engine.cache.CACHE_TYPES, in the order the menus list them
# B is: the Quantization lens's overrides, a preset, a searched mix, the file itself, another GGUF, float32 numerics
B_SOURCES = ("overrides", "preset", "mix", "file", "gguf", "adapter", "numerics")


@dataclass(frozen=True)
class TaskProgress:
    """Progress of a long task ('compare', 'sweep', 'apply', 'save', ...): what it does now and how far it is."""

    task: str
    what: str
    fraction: float


@dataclass(frozen=True)
class CompareOptions:
    """What the Compare view asks for; the bridge adds the model path and the overrides."""

    b_source: str = "overrides"
    b_path: str | None = None  # the other GGUF when b_source == 'gguf', the LoRA adapter when 'adapter'
    b_scale: float = 1.0  # the adapter's scale
    b_preset: str = "Q4_K_M"  # the preset when b_source == 'preset'
    b_rules: tuple[str, ...] = ()  # the searched mix's rules when b_source == 'mix'
    b_name: str = ""  # what to call that mix
    a_cache: str = "F32"
    b_cache: str = "F32"
    text: str = ""
    max_tokens: int = 512
    layer: int = 0
    head: int = 0


@dataclass(frozen=True)
class CompareRecord:
    """A against B on the same tokens: the engine's statistics and what the view needs to draw them."""

    a_label: str
    b_label: str
    a_cache: str
    b_cache: str
    a_bytes: int  # bytes of the tensors of each side, and bits per weight
    b_bytes: int
    a_bpw: float
    b_bpw: float
    stats: Comparison  # engine.quality.compare numbers (frozen floats and tuples)
    token_ids: npt.NDArray[np.int64]  # (N,)
    token_texts: tuple[str, ...]
    kld: F32  # (N,) KL(A || B) of the next-token distribution after each token
    layers: npt.NDArray[np.int64]  # (L,)
    rel_l2: F32  # (L,) ||h_B - h_A|| / ||h_A|| of the residual stream after each layer
    cosine: F32  # (L,) mean cosine of h_A and h_B
    top_ids: npt.NDArray[np.int64]  # (N, K) union of both models' top tokens at each position, -1 padded
    top_logp_a: F32  # (N, K) log p_A of those tokens
    top_logp_b: F32  # (N, K) log p_B of those tokens
    vocab: dict[int, str]  # texts of the tokens in top_ids
    n_layers: int
    n_heads: int
    elapsed_s: float
    own_l2: F32 | None = None  # (L,) each layer's own damage: B's layer run on A's input to it, against A's output
    own_cosine: F32 | None = None
    recurrent: tuple[int, ...] = ()  # a hybrid's recurrent (gated DeltaNet) layers: marked apart in the layer curve

    @property
    def n_tokens(self) -> int:
        return len(self.token_texts)

    def top(self, position: int, side: str, k: int = TOP_K) -> list[tuple[str, float, float]]:
        """The k most likely next tokens of side 'a' or 'b' after `position`: (text, p on that side, p on the other)."""
        ids = self.top_ids[position]
        mine, other = (self.top_logp_a, self.top_logp_b) if side == "a" else (self.top_logp_b, self.top_logp_a)
        lp, lo = mine[position], other[position]
        valid = np.flatnonzero(ids >= 0)
        order = valid[np.argsort(-lp[valid], kind="stable")][:k]
        return [(self.vocab.get(int(ids[j]), str(int(ids[j]))), float(np.exp(lp[j])), float(np.exp(lo[j]))) for j in order]


@dataclass(frozen=True)
class HeadPair:
    """One (layer, head) of both runs on the same tokens, for the side-by-side heatmaps."""

    layer: int
    head: int
    a: HeadRecord
    b: HeadRecord

    def difference(self) -> F32:
        """B - A where both may attend (NaN where the mask forbids it)."""
        d = self.b.weights.astype(np.float32) - self.a.weights.astype(np.float32)
        return np.where(self.a.allowed & self.b.allowed, d, np.nan).astype(np.float32)


@dataclass(frozen=True)
class SweepPoint:
    """One model variant of the preset sweep: its size and how far its next-token distributions are from the file's."""

    name: str  # preset name, the overrides' label, or 'mix ≤ B bpw'
    kind: str  # 'preset' | 'overrides' | 'mix'
    nbytes: int
    bpw: float
    kld_mean: float
    kld_p99: float
    same_top_pct: float
    ppl_ratio: float
    n_tokens: int
    rules: tuple[str, ...] = ()  # a mix's --tensor-type rules (every tensor's type)
    detail: str = ""  # a mix's summary (types, calibration KLD, search time)


@dataclass(frozen=True)
class SweepDone:
    """The sweep ended: how many points, and whether it was cancelled."""

    n_points: int
    cancelled: bool


def top_union(logp_a: F32, logp_b: F32, k: int = TOP_K) -> tuple[npt.NDArray[np.int64], F32, F32]:
    """Per row, the union of both sides' k most likely ids (-1 padded to 2k) with both log-probabilities."""
    n = logp_a.shape[0]
    step = max(1, (4 << 20) // max(1, 8 * logp_a.shape[-1]))  # rows at a time: argpartition's indices are int64

    def top(logp: F32) -> npt.NDArray[np.int64]:
        # each part copied out: a view would keep its block's whole (rows, n_vocab) int64 indices alive until the
        # concatenation (Gemma 3: 4 MiB a block, 256 MiB over a 128-row chunk)
        parts = [np.argpartition(-logp[r : r + step], k, axis=-1)[:, :k].copy() for r in range(0, n, step)]
        return np.concatenate(parts) if parts else np.zeros((0, k), np.int64)

    ta, tb = top(logp_a), top(logp_b)
    ids = np.full((n, 2 * k), -1, np.int64)
    for i in range(n):
        u = np.unique(np.concatenate([ta[i], tb[i]]))
        ids[i, : u.size] = u
    safe = np.maximum(ids, 0)
    rows = np.arange(n)[:, None]
    la = np.where(ids >= 0, logp_a[rows, safe], -np.inf).astype(np.float32)
    lb = np.where(ids >= 0, logp_b[rows, safe], -np.inf).astype(np.float32)
    return ids, la, lb


def plan_label(name: str, plan: object) -> str:
    """What B really is: 'Q2_K preset: 180 tensors fell back to Q4_0 (rows of 576 are not a multiple of 256)'."""
    groups: dict[tuple[str, int, int], int] = {}
    for tp in getattr(plan, "fallbacks", ()):
        # every fallback is from a type with 256-wide super-blocks (engine.quant.presets.FALLBACK)
        key = (tp.new.name, int(tp.shape[0]), 256)
        groups[key] = groups.get(key, 0) + 1
    notes = [f"{n} tensor{'s' * (n > 1)} fell back to {new} (rows of {cols} are not a multiple of {block})"
             for (new, cols, block), n in sorted(groups.items(), key=lambda kv: -kv[1])]
    return f"{name}: " + "; ".join(notes) if notes else name


class TopUnion:
    """top_union over rows that arrive in pieces (a comparison's chunks): add(A's rows, B's rows) in order, then
    result(). Each row is reduced alone, so the arrays equal top_union of the whole matrices."""

    def __init__(self) -> None:
        self.parts: list[tuple[npt.NDArray[np.int64], F32, F32]] = []

    def add(self, logp_a: F32, logp_b: F32) -> None:
        """The next rows of both sides' log-probabilities, (r, n_vocab) each."""
        self.parts.append(top_union(logp_a, logp_b))

    def result(self) -> tuple[npt.NDArray[np.int64], F32, F32]:
        """(ids, log p_A, log p_B), each (N, 2k)."""
        if not self.parts:
            return np.zeros((0, 2 * TOP_K), np.int64), np.zeros((0, 2 * TOP_K), np.float32), np.zeros((0, 2 * TOP_K), np.float32)
        return tuple(np.concatenate([p[i] for p in self.parts]) for i in range(3))  # type: ignore[return-value]


def make_compare_record(
    stats: Comparison, logp_a: F32 | None, logp_b: F32 | None, ids: Sequence[int], vocab_text: Callable[[int], str], *,
    labels: tuple[str, str], caches: tuple[str, str], sizes: tuple[int, int], bpws: tuple[float, float],
    n_heads: int, elapsed_s: float, own: tuple[F32, F32] | None = None, recurrent: Sequence[int] = (),
    top: tuple[npt.NDArray[np.int64], F32, F32] | None = None,
) -> CompareRecord:
    """Pack the engine's Comparison with the token texts and each position's top tokens on both sides (`top`: made
    already, as TopUnion makes it from a comparison's chunks; else from both sides' log-probabilities); `recurrent`:
    the layers whose mixer is a recurrent one (a hybrid's), which the layer curve draws apart."""
    if top is None:
        if logp_a is None or logp_b is None:
            raise ValueError("make_compare_record needs both sides' log-probabilities or their top tokens")
        top = top_union(logp_a, logp_b)
    top_ids, la, lb = top
    vocab = {int(i): vocab_text(int(i)) for i in np.unique(top_ids[top_ids >= 0])}
    texts = [vocab_text(int(i)) for i in ids]
    layers = np.array([x.layer for x in stats.per_layer], np.int64)
    return CompareRecord(
        a_label=labels[0], b_label=labels[1], a_cache=caches[0], b_cache=caches[1], a_bytes=sizes[0], b_bytes=sizes[1],
        a_bpw=bpws[0], b_bpw=bpws[1], stats=stats, token_ids=np.asarray(ids, np.int64), token_texts=tuple(texts),
        kld=np.asarray(stats.per_token_kld, np.float32), layers=layers,
        rel_l2=np.array([x.rel_l2 for x in stats.per_layer], np.float32),
        cosine=np.array([x.cosine for x in stats.per_layer], np.float32),
        top_ids=top_ids, top_logp_a=la, top_logp_b=lb, vocab=vocab, n_layers=len(layers), n_heads=n_heads,
        elapsed_s=elapsed_s, own_l2=None if own is None else np.asarray(own[0], np.float32),
        own_cosine=None if own is None else np.asarray(own[1], np.float32),
        recurrent=tuple(sorted(int(i) for i in recurrent)),
    )


def pareto_front(points: Sequence[SweepPoint]) -> list[int]:
    """Indices of the points no other point beats on both size and KLD, smallest first."""
    order = sorted(range(len(points)), key=lambda i: (points[i].nbytes, points[i].kld_mean))
    front: list[int] = []
    best = np.inf
    for i in order:
        if points[i].kld_mean < best:
            front.append(i)
            best = points[i].kld_mean
    return front


def summary_rows(rec: CompareRecord) -> list[tuple[str, str]]:
    """(statistic, value) rows of the summary table."""
    s = rec.stats
    return [
        ("tokens", f"{s.n_tokens}"),
        ("size A", f"{rec.a_bytes / 2**20:,.1f} MiB, {rec.a_bpw:.2f} bpw"),
        ("size B", f"{rec.b_bytes / 2**20:,.1f} MiB, {rec.b_bpw:.2f} bpw"),
        ("KV cache A / B", f"{rec.a_cache} / {rec.b_cache}"),
        ("KLD mean", f"{s.kld_mean:.6f}"),
        ("KLD median", f"{s.kld_median:.6f}"),
        ("KLD p90", f"{s.kld_p90:.6f}"),
        ("KLD p99", f"{s.kld_p99:.6f}"),
        ("KLD p99.9", f"{s.kld_p999:.6f}"),
        ("KLD max", f"{s.kld_max:.6f}"),
        ("same top token", f"{s.same_top_pct:.2f} %"),
        ("PPL A", f"{s.ppl_base:.4f}"),
        ("PPL B", f"{s.ppl_other:.4f}"),
        ("PPL ratio B/A", f"{s.ppl_ratio:.4f}"),
        ("ln(PPL B / PPL A)", f"{s.ln_ppl_ratio:+.5f}"),
        ("Δp mean", f"{s.delta_p_mean:+.3f} %"),
        ("Δp RMS", f"{s.delta_p_rms:.3f} %"),
    ]
