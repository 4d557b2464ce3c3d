#!/usr/bin/env bash
# One device call: environment facts, gpu tests, and the kbit format benchmark, all under $OUT.
# Usage on the device machine (repo root):  bash examples/device_check.sh
set -u
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m cache_tools doctor 2>&1 | tee "$OUT/doctor.txt" || python3 -c "import kernelgen; print(kernelgen.__version__)"
python3 -m pytest -q -m gpu tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.txt" | tail -30
python3 examples/bench_kbit_format.py --json "$OUT/bench_kbit_format.json" 2>&1 | tail -80
