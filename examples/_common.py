"""Shared by the examples: a place group over every GPU, or a clear exit without one."""

import sys

import cuda_sharded_jit as sharded


def group_or_exit(name: str) -> sharded.PlaceGroup:
    try:
        return sharded.PlaceGroup.by_devices()
    except RuntimeError as error:
        print(f"{name} needs a CUDA GPU: {error}", file=sys.stderr)
        sys.exit(2)
