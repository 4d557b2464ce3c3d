#!/usr/bin/env bash
# One device call: environment facts, every gpu test, then the benchmarks, logs under $OUT.
# Usage on the device machine (repo root):  bash examples/device_check.sh [tests|bench|sanitize|all]
# (about 3 min for "tests" on an H100 with a cold cache, 6-8 min for "bench"; "sanitize", not
# part of "all": examples/sanitize.py plain, then under compute-sanitizer's memcheck, initcheck,
# synccheck and racecheck, ~5 min).
set -u
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
python3 -m cache_tools doctor > "$OUT/doctor.txt" 2>&1 || python3 -c "import kernelgen; print(kernelgen.__version__)"
python3 -m cache_tools prewarm --arch native -j "$(nproc)" --quiet 2>&1 | tail -2
if [ "$what" = sanitize ]; then
  python3 examples/sanitize.py > "$OUT/sanitize.txt" 2>&1 || { tail -5 "$OUT/sanitize.txt"; exit 1; }
  tail -1 "$OUT/sanitize.txt"
  status=0
  for tool in memcheck initcheck synccheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 python3 examples/sanitize.py > "$OUT/sanitize_$tool.txt" 2>&1
    rc=$?
    echo "$tool: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.txt" | tail -1)"
    [ "$rc" = 0 ] || status=1
  done
  exit "$status"
fi
if [ "$what" != bench ]; then
  python3 -m pytest -q -p no:cacheprovider -m gpu tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.txt" | tail -30
fi
if [ "$what" != tests ]; then
  {
    python3 examples/bench_kbit_gemv.py --ms 1,16 --sweep "" --json "$OUT/gemv.json"
    python3 examples/bench_kbit_gemm.py --bits 4 --ms 16,32,64,256,2048,4096 --json "$OUT/kbit_gemm.json"
    python3 examples/bench_fp4_gemm.py --ms 1,4,16,256,4096 --json "$OUT/fp4.json"
    python3 examples/bench_mx_quant.py --ms 16,4096,16384 --json "$OUT/mx_quant.json"
    python3 examples/bench_mx_gemm.py --variants --shapes 8192x8192x8192,128x4096x4096 --json "$OUT/mx_gemm.json"
    python3 examples/bench_moe_routing.py
    python3 examples/bench_moe.py --shapes E128,E8 --ts 1,16,4096 --kbit-ts 1,16 --json "$OUT/moe.json"
  } 2>&1 | tee "$OUT/bench.txt" | tail -120
fi
