#!/usr/bin/env bash
# One device session's checks in one go (the lent H200s): build, the two-GPU sort's time
# broken down, the sort / reduce / scan / argmin performance targets, the GPU suite and the
# sanitizers (their `leaks` run is the exit-leak check). Outputs land in $OUT (or /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=$PATH:/usr/local/cuda/bin
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
git log --oneline | head -1; nvidia-smi -L
root=$PWD
(cd /tmp && python3 -W ignore "$root/benchmarks/sort_two_gpu_breakdown.py" > "$out/sort_breakdown.txt" 2>&1); head -4 "$out/sort_breakdown.txt"
(cd /tmp && python3 -W ignore "$root/benchmarks/run.py" --out "$out/bench" --sizes 28 --places 1,2 --dtypes float32 \
  --only sort,reduce,scan,argmin --no-plots 2>&1 | awk '/^### /{on = /^### Performance targets/} on' )
python3 -P -m pytest -q -m gpu -p no:cacheprovider -rf tests > "$out/suite.txt" 2>&1; tail -4 "$out/suite.txt"
bash .ci/sanitize.sh > "$out/sanitize.txt" 2>&1; echo "sanitize rc=$?"; grep -E "^==|SUMMARY|passed|failed|nanobind: leaked [0-9]+ inst" "$out/sanitize.txt"
