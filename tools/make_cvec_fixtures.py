"""llama.cpp's logits on the catalog models with control vectors that GGUF Lens wrote (issue 27's check).

    /tmp/llvenv/bin/python tools/make_cvec_fixtures.py [--models-dir DIR] [--model smollm2|gemma3|all]

Two control vector files per model are written from fixed seeds with GGUF Lens's own writer (`write_cvec`, which the
test suite calls too: the sha256 in the JSON says they are the same bytes), one random direction per layer
1..n_layer-1, strong enough that applying a direction one block early or late, or leaving out a scale, moves the
answer by far more than rounding. llama.cpp then loads them as common.cpp's common_control_vector_load does (read
here with gguf-py, llama.cpp's own GGUF reader: F32 `direction.<L>` tensors, each file's directions times its scale,
summed per layer), applies them with llama_set_adapter_cvec over its default layer range (1 .. n_layer) and runs
fixed token ids (tools/intervene_fixtures.py). Per case the top-K log-probabilities at every position go to
tests/fixtures/cvec/MODEL.npz, the files' sha256 to MODEL.json. A development tool, never a runtime dependency.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.intervene.control_vector import save  # noqa: E402
from tools.intervene_fixtures import MODELS, PREFILL, Shape, llama_logits, token_ids, write_fixture  # noqa: E402, F401

FIXTURES = ROOT / "tests" / "fixtures" / "cvec"
SEEDS = {"smollm2": {"a": 11, "b": 12}, "gemma3": {"a": 31, "b": 32}}
STRENGTH = {"smollm2": 0.6, "gemma3": 6.0}  # per-element std of each direction (Gemma's residual stream is larger)
TOKEN_SEED = {"smollm2": 5, "gemma3": 6}
CASES = {"a": [("a", 1.0)], "a_half": [("a", 0.5)], "a_half_b": [("a", 0.5), ("b", 1.0)]}


def directions(seed: int, model: str = "smollm2") -> dict[int, np.ndarray]:
    shape = MODELS[model]
    rng = np.random.default_rng(seed)
    return {layer: (rng.standard_normal(shape.dim) * STRENGTH[model]).astype(np.float32)
            for layer in range(1, shape.n_layers)}


def write_cvec(folder: Path, name: str, model: str = "smollm2") -> Path:
    """Control vector `name` ('a' or 'b') for a catalog model, written by GGUF Lens."""
    shape = MODELS[model]
    tag = "" if model == "smollm2" else f"{model}_"
    return save(folder / f"cvec_{tag}{name}.gguf", directions(SEEDS[model][name], model), shape.arch, shape.n_layers)


def load_like_common(files: list[tuple[Path, float]], dim: int) -> np.ndarray:
    """common_control_vector_load: per file F32 direction.<L> times the scale into data[(L-1) * n_embd], summed."""
    import gguf  # noqa: PLC0415 - llama.cpp's gguf-py

    data = np.zeros(0, np.float32)
    for path, scale in files:
        for t in gguf.GGUFReader(str(path)).tensors:
            layer = int(t.name.split(".", 1)[1])
            assert t.name.startswith("direction.") and layer > 0 and t.tensor_type == 0 and t.data.size == dim
            if data.size < dim * layer:
                data = np.concatenate([data, np.zeros(dim * layer - data.size, np.float32)])
            data[dim * (layer - 1) : dim * layer] += np.asarray(t.data, np.float32) * np.float32(scale)
    return data


def _with_cvec(shape: Shape, data: np.ndarray):  # noqa: ANN202
    def setup(llm) -> None:  # noqa: ANN001
        import llama_cpp  # noqa: PLC0415

        buf = np.ascontiguousarray(data, np.float32)
        ptr = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if llama_cpp.llama_set_adapter_cvec(llm._ctx.ctx, ptr, buf.size, shape.dim, 1, shape.n_layers) != 0:
            raise SystemExit("llama_set_adapter_cvec failed")
    return setup


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".cache/gguf-lens/models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cvec_fixtures"))
    ap.add_argument("--model", choices=[*MODELS, "all"], default="all")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for model in MODELS if args.model == "all" else [args.model]:
        shape = MODELS[model]
        files = {name: write_cvec(args.work, name, model) for name in SEEDS[model]}

        def logits_of(parts: list[tuple[str, float]], shape: Shape = shape, files: dict = files) -> np.ndarray:
            data = load_like_common([(files[n], s) for n, s in parts], shape.dim) if parts else np.zeros(0, np.float32)
            return llama_logits(args.models_dir / shape.file, ids, _with_cvec(shape, data))

        ids = token_ids(TOKEN_SEED[model])
        write_fixture(FIXTURES, model, shape, ids, files, CASES, logits_of)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
