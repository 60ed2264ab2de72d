#!/usr/bin/env bash
# The GPU check in one prepared command, for a machine with an NVIDIA GPU, CuPy and no network
# (the device machine: Python 3.12, numpy, cupy-cuda13x, pytest there; the catalog models are not).
#
#   bash benchmarks/gpu.sh    # from the repository root; every step has a timeout, 9 minutes at most
#
# 1. installs wheels carried in .whl/ (only if there are any: the engine needs nothing the image lacks),
# 2. writes synthetic GGUFs with the catalog models' exact shapes and tensor types (random weights,
#    benchmarks/synthetic_model.py: engine.gguf.write_gguf + engine.quant.quantize),
# 3. runs the CUDA compile tests (nvcc, NVRTC) and the `gpu` tests (each kernel against NumPy on random
#    blocks; whole forwards: KLD <= 1e-4 and the same top token on the golden prose),
# 4. runs `gguf-lens bench` on the GPU for both models (all layers, then half of SmolLM2's: the offload),
# 5. prints one JSON object: tests, speeds, and the issue's targets met or not.
# Logs and per-step JSON land in $OUT (or /tmp/gguf-lens-gpu) so they come back with the device tool.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gguf-lens-gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
SYN="${GGUF_LENS_SYNTHETIC_DIR:-/tmp/gguf-lens-synthetic}"
export GGUF_LENS_SYNTHETIC_DIR="$SYN"
mkdir -p "$SYN"

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true; } > "$OUT/device.txt" 2>&1
"$PY" -c "import sys, numpy, cupy; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__)" \
    >> "$OUT/device.txt" 2>&1

t0=$(date +%s)
for name in smollm2-135m-instruct gemma3-270m; do
    [ -s "$SYN/$name.gguf" ] || "$PY" benchmarks/synthetic_model.py "$name" "$SYN/$name.gguf" || exit 1
done
t_models=$(( $(date +%s) - t0 ))

timeout 90 "$PY" -m pytest tests/engine/test_cuda_compile.py tests/engine/test_backend.py -q -p no:cacheprovider \
    > "$OUT/compile-tests.log" 2>&1
rc_compile=$?
timeout 270 "$PY" -m pytest tests/engine/test_gpu.py -m gpu -q -p no:cacheprovider -rs -s --durations=10 \
    > "$OUT/gpu-tests.log" 2>&1
rc_gpu=$?

bench() {  # name, extra args...
    local name=$1; shift
    timeout 60 "$PY" -m engine.cli bench "$SYN/$name.gguf" --backend cupy --json "$@" 2>> "$OUT/bench.err" | tail -n 1
}
{
    echo "{"
    echo "\"smollm2\": $(bench smollm2-135m-instruct -p 512 -n 128 -r 3 || echo null),"
    echo "\"gemma3\": $(bench gemma3-270m -p 512 -n 128 -r 3 || echo null),"
    echo "\"smollm2_half_layers\": $(bench smollm2-135m-instruct -p 128 -n 32 -r 2 --gpu-layers 15 || echo null)"
    echo "}"
} > "$OUT/bench.json"

"$PY" - "$OUT" "$rc_compile" "$rc_gpu" "$t_models" <<'EOF'
import json, re, sys
from pathlib import Path
out, rc_compile, rc_gpu, t_models = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def summary(log):
    text = (out / log).read_text(errors="replace") if (out / log).exists() else ""
    lines = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", l)]
    fails = [l for l in text.splitlines() if l.startswith(("FAILED", "ERROR"))]
    return {"summary": lines[-1].strip("= ") if lines else "no summary", "failures": fails[:20]}
try:
    bench = json.loads((out / "bench.json").read_text())
except ValueError as exc:
    bench = {"error": f"bench.json unreadable: {exc}", "text": (out / "bench.json").read_text()[-2000:]}
def speed(key, field):
    row = bench.get(key) if isinstance(bench, dict) else None
    return row.get(field) if isinstance(row, dict) else None
targets = {
    "smollm2_gen_tok_s>=1000": (speed("smollm2", "gen_tok_s") or 0) >= 1000,
    "smollm2_prompt_tok_s>=20000": (speed("smollm2", "prompt_tok_s") or 0) >= 20000,
    "gemma3_gen_tok_s>=600": (speed("gemma3", "gen_tok_s") or 0) >= 600,
}
result = {
    "device": (out / "device.txt").read_text().strip().splitlines() if (out / "device.txt").exists() else [],
    "synthetic_models_s": t_models,
    "compile_tests": {"rc": rc_compile, **summary("compile-tests.log")},
    "gpu_tests": {"rc": rc_gpu, **summary("gpu-tests.log")},
    "kld": re.findall(r"^.*KLD max.*$", (out / "gpu-tests.log").read_text(errors="replace"), re.M) if (out / "gpu-tests.log").exists() else [],
    "bench": bench,
    "targets": targets,
}
(out / "summary.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result, indent=1))
EOF
