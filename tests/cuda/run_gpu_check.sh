#!/usr/bin/env bash
# The GPU check, on a machine with one CUDA GPU and its own Python + PyTorch (no
# package registry needed): installs DLCP in place (its C parts built with the
# machine's compiler), runs the CUDA tests (tests/cuda), then the check of
# 2 and 4 ranks sharing the GPU (tests/cuda/gpu_check.py). Results go to $OUT
# (default results/gpu_check): cuda_tests.xml, gpu_check.json, and the logs.
# Each step is bounded (install 120 s, pytest 120 s, the check 210 s): at most 7.5
# minutes in all; it took 203 s on one H200 (docs/results/2026-11-29/cuda_h200/).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-results/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
status=0

echo "==> environment" | tee "$OUT/summary.txt"
"$PY" - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(),
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
for name in ("numpy", "cryptography", "sklearn", "pytest", "setuptools"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"))
    except ImportError:
        print(name, "MISSING")
PY

# pip's editable install needs setuptools >= 77 in that Python (no build isolation:
# no registry); without it (or with STAGE=1) the C parts are built with cc and a
# packages (dlcp, shims, testbed) are imported from the checkout itself
echo "==> installing DLCP (pip install --no-deps --no-build-isolation -e .)" | tee -a "$OUT/summary.txt"
if [ "${STAGE:-0}" != 1 ] && timeout 120 "$PY" -m pip install --no-deps --no-build-isolation -e . \
    >"$OUT/install.log" 2>&1; then
  echo "installed" | tee -a "$OUT/summary.txt"
else
  echo "pip install failed or skipped (install.log): building by hand" | tee -a "$OUT/summary.txt"
  inc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  ext="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
  for src in dlcp/proto/_kernels.c dlcp/io/_udpio.c dlcp/io/_engine.c; do
    ${CC:-cc} -shared -fPIC -O2 -I"$inc" "$src" -o "${src%.c}$ext" -lpthread \
      >>"$OUT/install.log" 2>&1 || echo "cc failed for $src" | tee -a "$OUT/summary.txt"
  done
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "import dlcp, shims.process_group, shims.ddp" \
    >>"$OUT/install.log" 2>&1; then
  echo "DLCP does not import (install.log)" | tee -a "$OUT/summary.txt"; tail -20 "$OUT/install.log"
  exit 1
fi
"$PY" -c "import dlcp.io._engine, dlcp.io._udpio, dlcp.proto._kernels" 2>&1 \
  && echo "C parts built" | tee -a "$OUT/summary.txt" \
  || echo "C parts NOT built: DLCP runs its Python fallbacks" | tee -a "$OUT/summary.txt"

echo "==> tests/cuda/test_cuda_backend.py (pytest)" | tee -a "$OUT/summary.txt"
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_cuda_backend.py \
    --junitxml="$OUT/cuda_tests.xml" >"$OUT/cuda_tests.log" 2>&1
  rc=$?; echo "tests/cuda exit status $rc" | tee -a "$OUT/summary.txt"; tail -5 "$OUT/cuda_tests.log"
  [ $rc -eq 0 ] || status=1
else
  echo "pytest not installed: tests/cuda not run (gpu_check.py below checks the same)" \
    | tee -a "$OUT/summary.txt"
fi

echo "==> gpu_check.py: 2 and 4 ranks on one GPU" | tee -a "$OUT/summary.txt"
timeout 210 "$PY" tests/cuda/gpu_check.py --device cuda --world-sizes 2 4 --steps 30 \
  --json "$OUT/gpu_check.json" >"$OUT/gpu_check.log" 2>&1
rc=$?; echo "gpu_check exit status $rc" | tee -a "$OUT/summary.txt"
[ $rc -eq 0 ] || status=1
"$PY" - "$OUT/gpu_check.json" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no report: {exc}")
for world, entry in report["world_sizes"].items():
    if "error" in entry:
        print(world, "ranks: ERROR", entry["error"][-2000:])
        continue
    bad = [k for k, v in entry["collectives"].items() if not v]
    print(world, "ranks: collectives", "all right" if not bad else f"WRONG {bad}")
    for mode, m in entry["training"].items():
        print(f"  {mode:5s} {m['iteration_ms_median']:8.2f} ms/iter  grad rel diff "
              f"{m['grad_rel_diff_vs_gloo']:.2e}  param diff {m['param_max_abs_diff_vs_gloo']:.2e}"
              f"  staging {m.get('staging_ms_per_gradient', float('nan')):.3f} ms  ok {m['ok']}")
PY
exit $status
