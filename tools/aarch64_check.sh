#!/usr/bin/env bash
# Run the engine on aarch64 under user-mode emulation (qemu) and compare it with this x86 machine.
#
#     tools/aarch64_check.sh [--log FILE] [--quick | --tests "FILE ..."] [--keep-cache]
#
# Not part of the test suite: it needs root for apt, the network (deb.debian.org, PyPI) the first time, and
# about 13 minutes on two cores (most of it numba compiling the kernels inside the emulator; see README.md
# "ARM (aarch64)" for a measured run; the first run adds about 20 s of downloads, 400 MB on disk).
# --quick runs one test file instead of the subset, --tests the files named.
#
# Idempotent; everything comes from the package registries and lands in ~/.cache/gguf-lens/aarch64 (AARCH64_DIR):
#   1. apt: qemu-user-static on the host, and arm64 as a foreign architecture so apt can *download* arm64 .debs;
#   2. sysroot/: Debian's arm64 python3.11 and the libraries it needs, `apt-get download`ed and unpacked with
#      dpkg-deb -x (nothing arm64 is installed into the host system);
#   3. site/: the aarch64 wheels of the engine's runtime dependencies and pytest (pip install --target
#      --platform ..._aarch64 --only-binary=:all:), at the versions this checkout's venv has;
#   4. under `nice -n 19 qemu-aarch64-static -L sysroot`, with PYTHONPATH=this checkout:
#      (a) a subset of the kernel tests that run the portable code path (no x86 intrinsics), in a fresh numba
#          cache so every kernel compiles for aarch64;
#      (b) the ggml-numerics logits of a tiny random llama in Q8_0 and Q4_K_M (tools/aarch64_check.py), computed
#          here with the x86 kernels and there under emulation, compared bit for bit;
#      (c) the CPU detection (engine.kernels.simd.host_has, numba's target features) must report no x86
#          feature there; a SIGILL (exit 132) or an LLVM error naming an llvm.x86 intrinsic would show an x86
#          path reached, and the log is searched for both.
# The log (default ~/.cache/gguf-lens/aarch64/check.log) ends with a summary: what passed, timings, the logits.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${AARCH64_DIR:-$HOME/.cache/gguf-lens/aarch64}"
LOG="$DIR/check.log"
QUICK=0
KEEP_CACHE=0
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --log) LOG="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --tests) ONLY="$2"; shift 2 ;;
    --keep-cache) KEEP_CACHE=1; shift ;;
    -h|--help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
    *) echo "aarch64_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

HOST_PY="$ROOT/.venv/bin/python"
[ -x "$HOST_PY" ] || HOST_PY="$(command -v python3)"
SYSROOT="$DIR/sysroot"
SITE="$DIR/site"
PY="$DIR/python3"  # a host shell script that runs the arm64 python under qemu; it is sys.executable there too
WORK="$DIR/work"
# the kernel tests that run the portable path on aarch64, capped to keep a run near 13 minutes (test_iquant_kernels.py
# passes too but adds 8: run it with --tests)
TESTS=(
  tests/engine/kernels/test_kquant_kernels.py
  tests/engine/kernels/test_activations.py
  tests/engine/kernels/test_portable_fp16.py
  tests/engine/kernels/test_legacy_kernels.py
)
[ "$QUICK" = 1 ] && TESTS=(tests/engine/kernels/test_kquant_kernels.py)
[ -n "$ONLY" ] && read -r -a TESTS <<<"$ONLY"

mkdir -p "$DIR" "$WORK"
: > "$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
SUMMARY=()
note() { SUMMARY+=("$*"); say "$*"; }
START=$(date +%s)

# ---- 1. host packages
if ! command -v qemu-aarch64-static >/dev/null; then
  say "installing qemu-user-static (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static >>"$LOG" 2>&1 ||
    { apt-get update -q >>"$LOG" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static >>"$LOG" 2>&1; } ||
    { say "FAIL: could not install qemu-user-static"; exit 1; }
fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  say "adding arm64 as a foreign architecture (for apt-get download only)"
  dpkg --add-architecture arm64
fi
if ! apt-cache show python3.11:arm64 >/dev/null 2>&1; then
  say "apt-get update (arm64 package lists)"
  apt-get update -q >>"$LOG" 2>&1 || { say "FAIL: apt-get update"; exit 1; }
fi

# ---- 2. the arm64 sysroot
if [ ! -x "$SYSROOT/usr/bin/python3.11" ]; then
  say "downloading Debian's arm64 python3.11 and its libraries into $SYSROOT"
  mkdir -p "$DIR/debs" "$SYSROOT"
  # the :arm64 packages python3.11 and libstdc++6 (numba, llvmlite) need, less dpkg's own tools
  PKGS=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
           --no-enhances --no-pre-depends python3.11:arm64 libstdc++6:arm64 2>/dev/null |
         grep -E '^[a-z0-9].*:arm64$' | grep -vE '^(dpkg|tar|install-info):' | sort -u)
  (cd "$DIR/debs" && apt-get download -q $PKGS >>"$LOG" 2>&1) || { say "FAIL: apt-get download"; exit 1; }
  for deb in "$DIR"/debs/*_arm64.deb; do dpkg-deb -x "$deb" "$SYSROOT"; done
fi
cat > "$PY" <<EOF
#!/bin/sh
exec qemu-aarch64-static -L "$SYSROOT" -0 "$PY" "$SYSROOT/usr/bin/python3.11" "\$@"
EOF
chmod +x "$PY"

# ---- 3. aarch64 wheels, at the host venv's versions
if [ ! -d "$SITE/numba" ] || [ ! -d "$SITE/_pytest" ]; then
  pins=$("$HOST_PY" - <<'EOF'
from importlib.metadata import PackageNotFoundError, version
out = []
for name in ("numpy", "numba", "llvmlite", "gguf", "jinja2", "regex", "platformdirs", "threadpoolctl", "pytest",
             "hypothesis"):
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        out.append(name)
print(" ".join(out))
EOF
)
  say "pip: aarch64 wheels of $pins into $SITE"
  "$HOST_PY" -m pip install -q --target "$SITE" --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
    --platform manylinux_2_17_aarch64 --only-binary=:all: --python-version 3.11 --implementation cp $pins \
    >>"$LOG" 2>&1 || { say "FAIL: pip could not fetch the aarch64 wheels"; exit 1; }
fi

# ---- 4. the emulated runs
# the emulated processes' environment (the host python steps keep their own)
NUMBA_CACHE="$WORK/numba-cache"  # no numba cache files in the checkout; a fresh one makes every kernel compile
[ "$KEEP_CACHE" = 1 ] || rm -rf "$NUMBA_CACHE"
ARM=(env PYTHONPATH="$ROOT:$SITE" PYTHONUNBUFFERED=1
     PYTHONPYCACHEPREFIX="$WORK/pycache"  # the arm64 python writes no .pyc into the checkout
     NUMBA_CACHE_DIR="$NUMBA_CACHE"
     HYPOTHESIS_STORAGE_DIRECTORY="$WORK/hypothesis"  # nor examples into the checkout's .hypothesis
     GGUF_LENS_PRECOMPILE=0  # no background compile helpers: two cores, and they would only race the tests
     nice -n 19 "$PY")
cd "$ROOT" || exit 1
say "aarch64 python: $("${ARM[@]}" -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])' 2>&1)"
say "checkout $ROOT at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"

# (c) CPU detection
t0=$(date +%s)
"${ARM[@]}" "$ROOT/tools/aarch64_check.py" features 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then note "detection: PASS (no x86 feature reported on aarch64; $(( $(date +%s) - t0 )) s)"
else note "detection: FAIL (exit $rc)"; fi

# (a) kernel tests
t0=$(date +%s)
say "pytest under emulation: ${TESTS[*]}"
"${ARM[@]}" -m pytest -p no:cacheprovider -rfEs --durations=10 --junitxml="$WORK/junit.xml" \
  "${TESTS[@]/#/$ROOT/}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
counts=$("$HOST_PY" - "$WORK/junit.xml" <<'EOF' 2>/dev/null
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
t, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(f"{t - f - e - k} passed, {f} failed, {e} errors, {k} skipped")
EOF
)
note "kernel tests: ${counts:-no result} (pytest exit $rc; $(( $(date +%s) - t0 )) s; ${#TESTS[@]} files)"

# (b) logits, host vs aarch64
t0=$(date +%s)
say "tiny llama GGUFs (host)"
"$HOST_PY" "$ROOT/tools/aarch64_check.py" models "$WORK/models" >>"$LOG" 2>&1 &&
  "$HOST_PY" "$ROOT/tools/aarch64_check.py" logits "$WORK/models" "$WORK/logits_x86.npz" 2>&1 | tee -a "$LOG"
say "the same logits under emulation"
"${ARM[@]}" "$ROOT/tools/aarch64_check.py" logits "$WORK/models" "$WORK/logits_aarch64.npz" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ]; then
  cmp=$("$HOST_PY" "$ROOT/tools/aarch64_check.py" compare "$WORK/logits_x86.npz" "$WORK/logits_aarch64.npz" 2>&1)
  crc=$?
  echo "$cmp" >>"$LOG"
  while IFS= read -r line; do note "$line"; done <<<"$cmp"
  note "logits: $([ "$crc" = 0 ] && echo 'PASS (identical bits)' || echo 'DIFFER') ($(( $(date +%s) - t0 )) s)"
else
  note "logits: FAIL (aarch64 run exit $rc)"
fi

# an x86 path reached would show as an illegal instruction or an LLVM error naming an x86 intrinsic
if grep -qE 'llvm\.x86|Illegal instruction|SIGILL|exit 132' "$LOG"; then
  note "x86 paths: FAIL ($(grep -cE 'llvm\.x86|Illegal instruction|SIGILL' "$LOG") suspicious lines in the log)"
else
  note "x86 paths: PASS (no SIGILL, no llvm.x86 intrinsic in the log)"
fi

{
  echo
  echo "==== summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, qemu $(qemu-aarch64-static --version | head -1 | awk '{print $3}'), total $(( $(date +%s) - START )) s)"
  for line in "${SUMMARY[@]}"; do echo "  $line"; done
} | tee -a "$LOG"
echo "log: $LOG"
