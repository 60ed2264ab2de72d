"""llama.cpp's expert choices on the Mixture-of-Experts test models, read through its eval callback.

    /tmp/llvenv/bin/python tools/make_moe_routing_fixtures.py [--work DIR]

For each MoE model of tools/make_arch_models.py (qwen3moe, qwen2moe, mixtral, gpt_oss), quantized by llama.cpp to
F16 and Q4_K_M (and gpt_oss to MXFP4_MOE), llama.cpp runs the first PREFILL tokens as one batch (logits at every position, no flash attention, as the logits
fixtures ran) with a ggml_backend_sched_eval_callback that copies
every `ffn_moe_topk-<layer>` tensor (build_moe_ffn's selected experts, int32 [k, n_tokens], a view into the
argsort) as it is computed. They are stored per layer in tests/fixtures/arch/NAME_routing.npz. A development tool,
never a runtime dependency (README.md, "Golden fixtures").
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.make_arch_models import (  # noqa: E402
    FIXTURES,
    MOE_QUANTS,
    PREFILL,
    QUANTS,
    SPECS,
    quantize_llama_cpp,
    token_ids,
    write_arch,
)

MOE = [name for name, spec in SPECS.items() if spec.n_expert]
ROUTED_QUANTS = ("F16", "Q4_K_M")


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h of the vendored llama.cpp), up to its name."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


def llama_cpp_topk(path: Path, ids: list[int]) -> dict[int, np.ndarray]:
    """layer -> the experts llama.cpp chose for each of `ids` (one batch), (n_tokens, k) int32."""
    import llama_cpp as lc  # noqa: PLC0415 - the development venv only

    seen: dict[int, np.ndarray] = {}

    def on_eval(t_ptr: int, ask: bool, _user: int) -> bool:
        t = ctypes.cast(t_ptr, ctypes.POINTER(GgmlTensor)).contents
        name = t.name.decode(errors="replace")
        if not name.startswith("ffn_moe_topk-"):
            return False if ask else True
        if ask:
            return True  # yes: call again once it is computed
        k, n = t.ne[0], t.ne[1]
        raw = (ctypes.c_char * (t.nb[1] * n)).from_address(t.data)
        rows = np.frombuffer(bytes(raw), np.uint8).reshape(n, t.nb[1])
        seen[int(name.split("-")[1])] = rows[:, : 4 * k].copy().view(np.int32).reshape(n, k)
        return True

    callback = lc.ggml_backend_sched_eval_callback(on_eval)
    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(str(path).encode(), mparams)
    cparams = lc.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_threads = 1024, 512, 512, 2
    cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as the logits fixtures ran (F16 KV cache)
    cparams.cb_eval, cparams.cb_eval_user_data = callback, None
    ctx = lc.llama_init_from_model(model, cparams)
    batch = lc.llama_batch_init(len(ids), 0, 1)  # logits at every position: the last layer runs every row
    for i, tok in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, True
        batch.seq_id[i][0] = 0
    batch.n_tokens = len(ids)
    if lc.llama_decode(ctx, batch) != 0:
        raise SystemExit(f"llama_decode failed on {path}")
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=Path("/tmp/arch_models"))
    ap.add_argument("names", nargs="*", default=MOE)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ids = token_ids()[:PREFILL]
    for name in args.names:
        base = write_arch(args.work / f"{name}.F32.gguf", name)
        out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int32)}
        for quant in ROUTED_QUANTS + (("MXFP4_MOE",) if SPECS[name].arch == "gpt-oss" else ()):
            path = args.work / f"{name}.{quant}.gguf"
            quantize_llama_cpp(base, path, {**QUANTS, **MOE_QUANTS}[quant])
            for layer, experts in sorted(llama_cpp_topk(path, ids).items()):
                out[f"{quant}_layer{layer}"] = experts
        np.savez_compressed(FIXTURES / f"{name}_routing.npz", **out)
        print(name, {k: v.shape for k, v in out.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
