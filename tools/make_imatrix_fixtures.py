"""Importance matrices and imatrix quantizations made by llama.cpp's own tools, for tests/engine/quality/test_imatrix*.py.

Runs llama-imatrix and llama-quantize built from the llama.cpp sources vendored in llama-cpp-python's sdist:

  cmake -S .../vendor/llama.cpp -B /tmp/llbuild -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON \\
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF
  cmake --build /tmp/llbuild --target llama-imatrix llama-quantize -j2

and writes into tests/fixtures/imatrix/:
  - smollm2.short.imatrix.gguf: llama-imatrix on the first 2 chunks of 128 tokens of assets/imatrix_calibration.txt
    (-c 128 --chunks 2 -fa off -t 2, the text passed as `calibration.txt`), small enough for a test to recompute;
  - <model>.imatrix.gguf: the same over the whole text in chunks of 512 (llama-imatrix's defaults), the imatrix the
    quantization fixtures use, and (SmolLM2) <model>.imatrix.dat, the legacy format of the same run (--output-format dat);
  - quantize.json: for each model and its cases (MODEL_CASES) (a preset, optionally with --tensor-type rules, with or without the
    imatrix), what `llama-quantize --allow-requantize [--imatrix <model>.imatrix.gguf]` wrote: every tensor's
    type and sha256 prefix, the metadata keys in order, and the whole file's sha256 (the imatrix is named by that
    relative path on the command line, so the path in quantize.imatrix.file is the same wherever it runs).
Flash attention is off so that attn_output's inputs are the ones GGUF Lens computes (ggml's plain attention).

  python tools/make_imatrix_fixtures.py [--build /tmp/llbuild] [--models-dir DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.gguf import open_gguf  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "imatrix"
TEXT = ROOT / "assets" / "imatrix_calibration.txt"
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
# (case name, preset, rules, with the imatrix)
CASES = [
    ("Q4_K_M", "Q4_K_M", [], True),
    ("Q3_K_M", "Q3_K_M", [], True),
    ("Q2_K", "Q2_K", [], True),
    ("Q4_0", "Q4_0", [], True),
    ("Q5_1", "Q5_1", [], True),
    ("Q6_K", "Q6_K", [], True),
    ("IQ4_NL", "IQ4_NL", [], True),
    ("IQ4_XS", "IQ4_XS", [], True),
    ("IQ4_NL_plain", "IQ4_NL", [], False),
    ("IQ4_XS_plain", "IQ4_XS", [], False),
    ("Q4_K_M_rules", "Q4_K_M", ["attn_v=Q8_0", "ffn_down=Q5_K", "attn_q=IQ4_NL"], True),
]
# the cases run on each model (Gemma 3's 268M weights take llama-quantize minutes per i-quant on 2 cores)
MODEL_CASES = {"smollm2": [c[0] for c in CASES], "gemma3": ["Q4_K_M", "Q3_K_M", "Q4_0", "IQ4_XS", "Q4_K_M_rules"]}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def describe(path: Path) -> dict[str, object]:
    """Types, tensor hashes and metadata keys of a GGUF llama-quantize wrote."""
    with open_gguf(path) as g:
        names = list(g.tensors)
        return {
            "types": {n: g.tensors[n].qtype.name for n in names},
            "hashes": {n: hashlib.sha256(g.raw(n).tobytes()).hexdigest()[:16] for n in names},
            "metadata_keys": list(g.metadata),
            "imatrix_keys": {k: v for k, v in g.metadata.items() if k.startswith("quantize.imatrix.")},
            "file_sha256": sha256_file(path),
        }


def run(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(cmd, check=False, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="/tmp/llbuild", help="the cmake build folder holding bin/llama-imatrix")
    ap.add_argument("--models-dir", default=os.environ.get("GGUF_LENS_MODELS_DIR",
                                                           str(Path.home() / ".cache" / "gguf-lens" / "models")))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    imatrix_bin = Path(args.build) / "bin" / "llama-imatrix"
    quantize_bin = Path(args.build) / "bin" / "llama-quantize"
    for b in (imatrix_bin, quantize_bin):
        if not b.is_file():
            raise SystemExit(f"{b} is missing: build it as this script's docstring says")
    OUT.mkdir(parents=True, exist_ok=True)
    t = str(args.threads)
    result: dict[str, object] = {"source": "llama-imatrix and llama-quantize from llama-cpp-python 0.3.36's vendored "
                                           "llama.cpp", "text": TEXT.name, "models": {},
                              "cases": {c: {"preset": p, "rules": r, "imatrix": i} for c, p, r, i in CASES}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shutil.copy(TEXT, tmp / "calibration.txt")
        for key, fname in MODELS.items():
            src = Path(args.models_dir) / fname
            common = [str(imatrix_bin), "-m", str(src), "-f", "calibration.txt", "-fa", "off", "-t", t, "--no-ppl"]
            run([*common, "-o", f"{key}.imatrix.gguf"], tmp)
            names = [f"{key}.imatrix.gguf"]
            if key == "smollm2":  # the short run our values are tested against, and the legacy format, once
                run([*common, "-c", "128", "--chunks", "2", "-o", f"{key}.short.imatrix.gguf"], tmp)
                run([*common, "--output-format", "dat", "-o", f"{key}.imatrix.dat"], tmp)
                names += [f"{key}.short.imatrix.gguf", f"{key}.imatrix.dat"]
            for name in names:
                shutil.copy(tmp / name, OUT / name)
            entry: dict[str, object] = {"file": fname, "source_sha256": sha256_file(src), "cases": {}}
            for case, preset, rules, with_imatrix in CASES:
                if case not in MODEL_CASES[key]:
                    continue
                out = tmp / "out.gguf"
                cmd = [str(quantize_bin), "--allow-requantize"]
                if with_imatrix:
                    cmd += ["--imatrix", f"{key}.imatrix.gguf"]
                for r in rules:
                    cmd += ["--tensor-type", r]
                run([*cmd, str(src), str(out), preset, t], tmp)
                entry["cases"][case] = describe(out)  # type: ignore[index]
                print(f"{key} {case}", file=sys.stderr)
            result["models"][key] = entry  # type: ignore[index]
            (OUT / "quantize.json").write_text(json.dumps(result, indent=1) + "\n")  # a model at a time
    (OUT / "quantize.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
