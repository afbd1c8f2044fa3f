#!/usr/bin/env bash
# compute-sanitizer over a representative subset of the GPU suite (the whole suite runs for
# hours under it). Run on a GPU machine after `bash .ci/gpu-suite.sh` has installed the build:
#   bash .ci/sanitize.sh [memcheck|racecheck|synccheck|initcheck|leaks ...]
# Each tool must report zero errors (the script exits non-zero otherwise). `leaks` runs
# memcheck without host backtraces and fails when nanobind reports objects alive at exit: with
# backtraces on, the sanitizer keeps the Python frames it captured (and the arrays they hold)
# referenced, so nanobind's "leaked instances" report then says nothing about the library
# (2x H200, 2026-11-30: with backtraces, arrays passed to a reduction stayed alive after `del`;
# without them, or without the sanitizer, every array went at `del`).
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
tools=("${@:-memcheck racecheck leaks}")
# small inputs, every kernel family: transform, reduce (one and several places), scans,
# adjacent_difference, fill / sequence / count / histogram, sort, tuple accumulators
subset=(
  "tests/test_transform.py::test_binary_same_dtype"
  "tests/test_reduce.py"
  "tests/test_scan.py"
  "tests/test_opaque.py"
  "tests/test_sort.py::test_sort_explicit_and_zero_size_shards"
  "tests/test_sort.py::test_sort_matches_numpy[2places-uniform-int32]"
  "tests/test_sort.py::test_sort_matches_numpy[4places-uniform-float64]"
  "tests/test_tuples.py::test_min_max_in_one_pass"
)
status=0
for tool in ${tools[*]}; do
  if [ "$tool" = leaks ]; then
    echo "== compute-sanitizer --tool memcheck --show-backtrace no (objects alive at exit)"
    log=$(mktemp)
    compute-sanitizer --tool memcheck --show-backtrace no --error-exitcode 99 --target-processes all \
      python3 -P -m pytest -q -m gpu -x -p no:cacheprovider "${subset[@]}" 2>&1 | tee "$log" || status=$?
    if grep -q "nanobind: leaked" "$log"; then status=1; fi
    rm -f "$log"
    continue
  fi
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --target-processes all \
    python3 -P -m pytest -q -m gpu -x -p no:cacheprovider "${subset[@]}" || status=$?
done
exit $status
