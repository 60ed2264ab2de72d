"""GpuNet: a loaded NumPy model's forward pass on a CUDA device, the first n_cpu layers staying on NumPy.

The weights stay in their GGUF blocks (uploaded once; re-uploaded when a layer is requantized). A decode
step (one token) runs the fused kernels of engine/gpu/cuda: GEMV with the RMSNorm or gated activation in
its prologue and the residual add in its epilogue, RoPE with the KV-cache write, attention over the cache,
and the greedy pick; from the second step on, the step is replayed as one CUDA graph, so a small model's
decode is not bound by kernel launches. The graph reads the token, the position and the cache's capacity
and row pointers from device memory (DecodeBuffers.state, .kv_table), so it serves every step of every
cache and survives the cache growing. A prefill (several tokens, or a step a Recorder watches)
dequantizes float32 tiles for cuBLAS and runs the same row kernels.

Faults: out of memory in a step raises MemoryError (generate turns it into an InferenceError and keeps the
conversation); any other CUDA failure moves the model to the CPU for good, rebuilding the KV cache there
from its tokens, with a note through `on_fallback`.
"""
from __future__ import annotations

import logging
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from engine.backend import Backend
from engine.cache import KVCache
from engine.errors import SettingError
from engine.gpu.cache import DeviceKVCache
from engine.gpu.device import Device, arg
from engine.gpu.linear import BlockStore, DeviceLinear
from engine.gpu.plan import ArchPlan, LayerPlan, arch_plan
from engine.models.decoder import DecoderModel
from engine.observe.recorder import Recorder
from engine.tensor import Linear

log = logging.getLogger(__name__)

FallbackHook = Callable[[Backend, str], None]
ATT_THREADS = 128  # ATT_WARPS * 32 in attention.cu
MAX_SPLIT = 64  # key slices per query row in attention
REBUILD_CHUNK = 256  # tokens per forward when the KV cache is rebuilt on the CPU


class DeviceLayer:
    """One block's norms, RoPE frequencies and matrices on the device."""

    def __init__(self, device: Device, store: BlockStore, plan: LayerPlan):
        up = device.upload
        self.plan = plan
        self.attn_norm = up(plan.attn_norm, np.float32)
        self.ffn_norm = up(plan.ffn_norm, np.float32)
        self.q_norm = None if plan.q_norm is None else up(plan.q_norm, np.float32)
        self.k_norm = None if plan.k_norm is None else up(plan.k_norm, np.float32)
        self.post_attn_norm = None if plan.post_attn_norm is None else up(plan.post_attn_norm, np.float32)
        self.post_ffn_norm = None if plan.post_ffn_norm is None else up(plan.post_ffn_norm, np.float32)
        self.freqs = up(plan.freqs, np.float64)
        self.rope_dim = 2 * plan.freqs.size
        self.qkv = DeviceLinear(device, store, plan.qkv)
        self.wo = DeviceLinear(device, store, [plan.wo])
        self.gate_up = DeviceLinear(device, store, plan.gate_up)
        self.down = DeviceLinear(device, store, [plan.down])

    def matrices(self) -> list[DeviceLinear]:
        return [self.qkv, self.wo, self.gate_up, self.down]


@dataclass
class DecodeBuffers:
    """Fixed device arrays of one decode step: a captured graph reads and writes exactly these."""

    state: Any  # int32 (4,): token, position of the first row, cache capacity (read by kernels, set by the host)
    state_host: np.ndarray
    kv_table: Any  # uint64 (2 * device layers,): the bound cache's key and value rows per device layer
    x: Any  # (1, dim) residual stream
    qkv: Any  # (1, q_dim + 2 kv_dim)
    q: Any  # (n_heads, 1, head_dim) post-RoPE query
    attn: Any  # (1, n_heads * head_dim)
    o: Any  # (1, dim) projection before a post-norm
    gu: Any  # (1, 2 * hidden) gate | up
    logits: Any  # (1, n_vocab)
    part: Any  # attention slices (n_heads * MAX_SPLIT * (head_dim + 2))
    pick: Any  # int32 (1,): the greedy token


class GpuNet:
    """A DecoderModel run on a CUDA device: layers >= n_cpu, the final norm and the output matrix on the GPU.

    Attributes it does not have (args, layers, output, tok_embd, ...) are the NumPy model's, so code written
    for a DecoderModel (the lenses, requantizing) works unchanged; the device copies are dev_*.
    """

    def __init__(self, cpu: DecoderModel, backend: Backend, gpu_layers: int | None = None,
                 on_fallback: FallbackHook | None = None):
        a = cpu.args
        n = a.n_layers
        g = n if gpu_layers is None else max(0, min(n, gpu_layers))
        if g < 1:
            raise SettingError("the GPU runner needs at least one layer on the GPU")
        self.cpu = cpu
        self.plan: ArchPlan = arch_plan(cpu)
        self.n_cpu = n - g
        self.backend = backend
        self.on_fallback = on_fallback
        self.fell_back = False
        self.use_graphs = True
        self.device = Device(backend)
        self.device.kernels.compile_all()
        self.store = BlockStore(self.device)
        self._graphs: dict[tuple[int, bool], Any] = {}  # (key slices, f16 cache) -> captured decode step
        self._stepped: set[tuple[int, bool]] = set()  # shapes that ran once eagerly (capture comes second)
        self._bound: tuple[Any, int] | None = None  # (weakref to the cache in kv_table, its generation)
        self._swaps_seen = Linear.swaps
        p = self.plan
        with self.device.stream:
            self.dev_layers = {i: DeviceLayer(self.device, self.store, p.layers[i]) for i in range(self.n_cpu, n)}
            self.dev_out_norm = self.device.upload(p.out_norm, np.float32)
            self.dev_output = DeviceLinear(self.device, self.store, [p.output])
            self._embed_source = cpu.tok_embd
            self.embed_table = self.store.get(cpu.tok_embd) if self.n_cpu == 0 else None
            self.buf = self._decode_buffers()
        self.device.synchronize()
        log.info("%d of %d layers on %s (%d MiB of weights)", g, n, self.device.name, self.store.nbytes >> 20)

    def __getattr__(self, name: str) -> Any:
        # everything else (args, arch_name, layers, tok_embd, weights, ...) is the NumPy model's
        if name == "cpu":
            raise AttributeError(name)
        return getattr(self.cpu, name)

    @property
    def gpu_layers(self) -> int:
        return 0 if self.fell_back else self.cpu.args.n_layers - self.n_cpu

    def _decode_buffers(self) -> DecodeBuffers:
        a = self.cpu.args
        e = self.device.empty
        q_dim, kv_dim = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        state_host = np.zeros(4, np.int32)
        n_gpu = a.n_layers - self.n_cpu
        return DecodeBuffers(
            state=self.device.upload(state_host), state_host=state_host,
            kv_table=self.device.upload(np.zeros(2 * n_gpu, np.uint64)), x=e((1, a.dim)),
            qkv=e((1, q_dim + 2 * kv_dim)), q=e((a.n_heads, 1, a.head_dim)), attn=e((1, q_dim)), o=e((1, a.dim)),
            gu=e((1, 2 * a.hidden_dim)), logits=e((1, a.n_vocab)), part=e(a.n_heads * MAX_SPLIT * (a.head_dim + 2)),
            pick=e(1, np.int32),
        )

    # ---- the NumPy model's contract

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> KVCache:
        """An empty cache: host rows for the CPU layers, device rows for the others."""
        if self.fell_back:
            return self.cpu.new_cache(n_ctx, cache_type)
        a = self.cpu.args
        return DeviceKVCache(self.device, a.n_layers, self.n_cpu, a.n_kv_heads, a.head_dim, n_ctx or a.n_ctx,
                             cache_type or "F32")

    def linears(self) -> dict:
        return self.cpu.linears()

    def warm(self, progress: Callable[[float], None] | None = None) -> None:
        """Build the float32 copies of the CPU layers only (the device layers multiply from their blocks); with ggml
        numerics the CPU layers compute on their blocks, so only their kernels are prepared."""
        if self.cpu.numerics == "ggml":
            self.cpu.warm(progress)
            return
        for i in range(self.n_cpu):
            layer = self.cpu.layers[i]
            for f in layer.fused():
                if not f._fresh():
                    f._build()
            layer.wo.dense()
            layer.ffn.w_down.dense()
            if progress is not None:
                progress((i + 1) / max(1, self.n_cpu))

    def forward(
        self, tokens: npt.ArrayLike, cache: KVCache, recorder: Recorder | None = None, all_logits: bool = False
    ) -> npt.NDArray[np.float32]:
        """As DecoderModel.forward: logits on the host; K/V written into the cache, not committed."""
        if self.fell_back or not isinstance(cache, DeviceKVCache) or cache.device is not self.device:
            return self.cpu.forward(tokens, self._host_cache(cache), recorder, all_logits)
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self.cpu.check_tokens(ids)
        t, start = ids.size, cache.length
        if recorder is not None:
            recorder.begin(start, t)
        try:
            cache.reserve(start + t)
            x_host = self._cpu_layers(ids, start, cache, recorder)
            with self.device.stream:
                self._sync_weights()
                if t == 1 and recorder is None:
                    self._decode(int(ids[0]), start, cache, x_host)
                    logits = self.buf.logits
                else:
                    logits = self._prefill(ids, start, cache, recorder, all_logits, x_host)
                return self.backend.to_numpy(logits).reshape(-1, self.cpu.args.n_vocab)
        except Exception as exc:  # noqa: BLE001 - sorted by _fault; anything else is raised again
            self._fault(exc, cache)
            return self.cpu.forward(tokens, self._host_cache(cache), recorder, all_logits)

    def greedy_step(self, token: int, cache: KVCache) -> int:
        """Run one token, commit it, and return the argmax of the next-token logits: only 4 bytes come back."""
        if self.fell_back or not isinstance(cache, DeviceKVCache) or cache.device is not self.device:
            logits = self.forward([token], cache)
            cache.commit([token])
            return int(np.argmax(logits[-1]))
        ids = np.asarray([token], dtype=np.int64)
        self.cpu.check_tokens(ids)
        start = cache.length
        try:
            cache.reserve(start + 1)
            x_host = self._cpu_layers(ids, start, cache, None)
            with self.device.stream:
                self._sync_weights()
                self._decode(int(token), start, cache, x_host)
                pick = int(self.backend.to_numpy(self.buf.pick)[0])
        except Exception as exc:  # noqa: BLE001
            self._fault(exc, cache)
            return self.greedy_step(token, cache)
        cache.commit([token])
        return pick

    # ---- the device passes

    def _cpu_layers(self, ids: np.ndarray, start: int, cache: DeviceKVCache, recorder: Recorder | None) -> np.ndarray | None:
        """The residual stream after the CPU layers (None when every layer is on the device)."""
        if self.n_cpu == 0:
            return None
        x = self.cpu.embed(ids)
        return self.cpu.run_layers(x, start, cache, recorder, range(self.n_cpu))

    def _set_state(self, token: int, start: int, cache: DeviceKVCache) -> None:
        """Write the step's token, position and cache capacity, and the cache's row pointers when they changed."""
        b = self.buf
        b.state_host[0], b.state_host[1], b.state_host[2] = token, start, cache.capacity
        self.backend.copy_to_device(b.state, b.state_host)
        bound = self._bound
        if bound is None or bound[0]() is not cache or bound[1] != cache.generation:
            addr = self.backend.address
            table = np.array([addr(a) for i in self.dev_layers for a in cache.device_rows(i)], np.uint64)
            self.backend.copy_to_device(b.kv_table, table)
            self._bound = (weakref.ref(cache), cache.generation)

    def _decode(self, token: int, start: int, cache: DeviceKVCache, x_host: np.ndarray | None) -> None:
        """One token through the device layers and the head into buf.logits and buf.pick (a graph when captured)."""
        self._set_state(token, start, cache)
        if x_host is not None:
            self.backend.copy_to_device(self.buf.x, x_host)
        key = (_decode_split(cache.capacity), cache.cache_f16)
        graph = self._graph(key)
        if graph is not None:
            graph.launch(self.device.stream)
        else:
            self._decode_launches(*key)

    def _graph(self, key: tuple[int, bool]) -> Any:
        """The captured decode step of this shape: None the first time (that step runs eagerly), captured the second."""
        if not self.use_graphs:
            return None
        graph = self._graphs.get(key)
        if graph is not None:
            return graph
        if key not in self._stepped:
            self._stepped.add(key)
            return None
        stream = self.device.stream
        try:
            stream.begin_capture()
            try:
                self._decode_launches(*key)
            finally:
                graph = stream.end_capture()
        except Exception as exc:  # noqa: BLE001 - capture is an optimisation: fall back to plain launches
            if self.backend.classify_error(exc) == "oom":
                raise
            log.warning("CUDA graph capture failed (%s); decoding with plain kernel launches", exc)
            self.use_graphs = False
            return None
        self._graphs[key] = graph
        return graph

    def _decode_launches(self, n_split: int, cache_f16: bool) -> None:
        """The kernels of one decode step, on fixed buffers only (what a graph captures)."""
        b, p, a, d = self.buf, self.plan, self.cpu.args, self.device
        if self.n_cpu == 0:
            d.embed(self.embed_table, int(self._embed_source.qtype), a.dim, b.state, 1, a.n_vocab, p.embed_scale, b.x)
        gate, up = b.gu[:, : a.hidden_dim], b.gu[:, a.hidden_dim :]
        for i, L in self.dev_layers.items():
            slot = i - self.n_cpu
            L.qkv.gemv(b.x, b.qkv, norm_w=L.attn_norm, eps=p.eps)
            self._rope_store(L, b.qkv, 1, b.q, slot, cache_f16)
            self._attention(L, b.q, 1, slot, cache_f16, b.attn, b.part, n_split)
            if L.post_attn_norm is None:
                L.wo.gemv(b.attn, b.x, resid=b.x)
            else:
                L.wo.gemv(b.attn, b.o)
                d.rms_norm(b.o, L.post_attn_norm, p.eps, out=b.x, resid=b.x)
            L.gate_up.gemv(b.x, b.gu, norm_w=L.ffn_norm, eps=p.eps)
            if L.post_ffn_norm is None:
                L.down.gemv(gate, b.x, act=p.act, x2=up, resid=b.x)
            else:
                L.down.gemv(gate, b.o, act=p.act, x2=up)
                d.rms_norm(b.o, L.post_ffn_norm, p.eps, out=b.x, resid=b.x)
        self.dev_output.gemv(b.x, b.logits, norm_w=self.dev_out_norm, eps=p.eps)
        d.argmax(b.logits, a.n_vocab, b.pick)

    def _prefill(self, ids: np.ndarray, start: int, cache: DeviceKVCache, recorder: Recorder | None,
                 all_logits: bool, x_host: np.ndarray | None) -> Any:
        """T tokens through the device layers: float32 tiles and cuBLAS for the matrices; logits (rows, n_vocab)."""
        p, a, d = self.plan, self.cpu.args, self.device
        t = ids.size
        self._set_state(int(ids[0]), start, cache)
        if x_host is None:
            x = d.empty((t, a.dim))
            d.embed(self.embed_table, int(self._embed_source.qtype), a.dim, d.upload(ids, np.int32), t, a.n_vocab,
                    p.embed_scale, x)
        else:
            x = d.upload(x_host, np.float32)
        n_split = _prefill_split(a.n_heads * t, start + t)
        part = d.empty(a.n_heads * t * n_split * (a.head_dim + 2)) if n_split > 1 else None
        for i, L in self.dev_layers.items():
            h = d.rms_norm(x, L.attn_norm, p.eps)
            qkv = L.qkv.matmul(h)
            q = d.empty((a.n_heads, t, a.head_dim))
            self._rope_store(L, qkv, t, q, i - self.n_cpu, cache.cache_f16)
            if recorder is not None:
                recorder.record_q(i, start, self.backend.to_numpy(q), L.plan.spec)
            attn = d.empty((t, a.n_heads * a.head_dim))
            self._attention(L, q, t, i - self.n_cpu, cache.cache_f16, attn, part, n_split)
            o = L.wo.matmul(attn)
            if L.post_attn_norm is None:
                x += o
            else:
                d.rms_norm(o, L.post_attn_norm, p.eps, out=x, resid=x)
            h = d.rms_norm(x, L.ffn_norm, p.eps)
            g = d.gated_act(L.gate_up.matmul(h), a.hidden_dim, p.act)
            f = L.down.matmul(g)
            if L.post_ffn_norm is None:
                x += f
            else:
                d.rms_norm(f, L.post_ffn_norm, p.eps, out=x, resid=x)
            if recorder is not None:
                recorder.record_hidden(i, start, self.backend.to_numpy(x))
        rows = x if all_logits else x[-1:]
        return self.dev_output.matmul(d.rms_norm(rows, self.dev_out_norm, p.eps))

    def _rope_store(self, L: DeviceLayer, qkv: Any, t: int, q_out: Any, slot: int, cache_f16: bool) -> None:
        """q/k norms and RoPE; q into q_out, k and v into device layer `slot` of the bound cache."""
        a = self.cpu.args
        items = t * (a.n_heads + 2 * a.n_kv_heads)
        args = (qkv, np.int32(t), np.int32(a.n_heads), np.int32(a.n_kv_heads), np.int32(a.head_dim),
                arg(L.q_norm), arg(L.k_norm), np.float32(self.plan.eps), L.freqs, np.int32(L.rope_dim),
                np.int32(self.plan.neox), self.buf.state, q_out, self.buf.kv_table, np.int32(slot),
                np.int32(cache_f16))
        self.device.launch("rope_store", math.ceil(items / 4), 128, args)

    def _attention(self, L: DeviceLayer, q: Any, t: int, slot: int, cache_f16: bool, out: Any, part: Any,
                   n_split: int) -> None:
        """Attention of q (n_heads, T, d) over device layer `slot` of the bound cache into out (T, n_heads * d)."""
        a = self.cpu.args
        rows = a.n_heads * t
        args = (q, self.buf.kv_table, np.int32(slot), np.int32(cache_f16), self.buf.state, np.int32(t),
                np.int32(a.n_heads), np.int32(a.n_kv_heads), np.int32(a.head_dim), np.float32(L.plan.spec.scale),
                np.int32(L.plan.window or 0), np.int32(n_split), out, arg(part if n_split > 1 else None))
        self.device.launch("attention", (rows, n_split), ATT_THREADS, args)
        if n_split > 1:
            self.device.launch("attention_combine", rows, ATT_THREADS,
                               (part, np.int32(t), np.int32(a.n_heads), np.int32(a.head_dim), np.int32(n_split), out))

    # ---- weights that changed, and faults

    def _sync_weights(self) -> None:
        """Upload the matrices that were requantized since the last step (and forget captured graphs)."""
        if Linear.swaps == self._swaps_seen and self.cpu.tok_embd is self._embed_source:
            return  # the common case, one comparison per step
        self._swaps_seen = Linear.swaps
        mats = [m for L in self.dev_layers.values() for m in L.matrices()] + [self.dev_output]
        stale = [m for m in mats if m.stale()]
        embed_stale = self.embed_table is not None and self.cpu.tok_embd is not self._embed_source
        if not stale and not embed_stale:
            return
        for m in stale:
            m.refresh()
        self._embed_source = self.cpu.tok_embd
        if self.embed_table is not None:
            self.embed_table = self.store.get(self._embed_source)
        self.store.keep_only([s for m in mats for s in m.sources()] + [self._embed_source])
        self._graphs.clear()
        self._stepped.clear()

    def _fault(self, exc: Exception, cache: KVCache) -> None:
        """Out of memory: MemoryError (the step can be retried). Another CUDA failure: move to the CPU. Else: raise."""
        kind = self.backend.classify_error(exc)
        if kind is None:
            raise exc
        if kind == "oom":
            if type(exc) is MemoryError:  # the host ran out (a CPU layer), not the device
                raise exc
            self._graphs.clear()
            self.backend.free_cached_memory()
            raise MemoryError(f"the GPU ({self.device.name}) ran out of memory at token {cache.length}") from exc
        self._fall_back(f"the GPU ({self.device.name}) failed ({type(exc).__name__}: {exc}); "
                        "continuing on the CPU")

    def _fall_back(self, note: str) -> None:
        from engine.backend import NUMPY  # noqa: PLC0415

        log.warning(note)
        self.fell_back = True
        self.use_graphs = False
        self._graphs.clear()
        self.dev_layers = {}
        self.backend = Backend(NUMPY.name, NUMPY.xp, note=note)
        if self.on_fallback is not None:
            self.on_fallback(self.backend, note)

    def _host_cache(self, cache: KVCache) -> KVCache:
        """The cache with every layer on the host; a device cache is rebuilt there by running its tokens again."""
        if not isinstance(cache, DeviceKVCache) or cache.on_host:
            return cache
        tokens = list(cache.tokens)
        cache.move_to_host(copy_rows=False)
        for s in range(0, len(tokens), REBUILD_CHUNK):
            chunk = tokens[s : s + REBUILD_CHUNK]
            self.cpu.forward(chunk, cache)
            cache.commit(chunk)
        return cache


def _decode_split(capacity: int) -> int:
    """Key slices per query head in a decode step, from the cache's capacity (a graph is captured per value):
    one slice up to 256 positions, then about 64 keys a slice, so each warp walks a handful of keys."""
    if capacity <= 256:
        return 1
    return max(1, min(MAX_SPLIT, capacity // 64))


def _prefill_split(rows: int, n_keys: int) -> int:
    """Key slices per query row in a prefill: enough blocks to fill the device when there are few rows."""
    if rows >= 512:
        return 1
    return max(1, min(16, math.ceil(n_keys / 256)))
