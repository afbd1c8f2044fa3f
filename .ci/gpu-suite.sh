#!/usr/bin/env bash
# Build and run the GPU suite on a machine with a GPU (the lent H200s included):
#   bash .ci/gpu-suite.sh [extra pytest arguments]
# Uses the machine's Python packages; wheels in ./.whl (e.g. numpy<2.5, staged by
# ../shared/device/stage-wheels.sh) are installed first into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${CSJ_ARCHS:-$arch}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  python3 -m pip install -q --no-build-isolation --no-deps .
# -P: do not put the source tree (which has no built extension) on sys.path
python3 -P -m pytest -q -m gpu tests "$@"
