"""What an operator became: its LTO-IR, the linked cubin, and in the SASS the fused
multiply-adds of `alpha * x + y` inside the kernel's loop, with no call left (the operator
was inlined). Works without a GPU; the SASS needs cuobjdump (the test extra, or
`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`).

    python examples/inspect_operator.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded


@sharded.op
def saxpy(x, y, alpha):
    return alpha * x + y


def main() -> int:
    kernel = sharded.compile(saxpy, "transform", (np.float32, np.float32, np.float32),
                             arch="sm_90", scalars=(2,))
    print(f"{kernel.op_name}: module {kernel.module}, result {kernel.out_dtype}")
    print(f"operator LTO-IR: {len(kernel.ltoir)} bytes; linked cubin for {kernel.arch}: "
          f"{len(kernel.cubin)} bytes; cache hit: {kernel.cache_hit}")
    try:
        sass = kernel.sass()
    except RuntimeError as error:  # no cuobjdump
        print(f"SASS not shown: {error}")
        return 0
    lines = [line.split(";")[0].strip() for line in sass.splitlines()]
    fused = [line for line in lines if "FFMA" in line.split()]
    loads = [line for line in lines if "LDG.E.128" in line]
    print(f"inlined: {'yes' if not any('CALL' in line for line in lines) else 'no'} (no CALL in the SASS)")
    print(f"{len(fused)} FFMA instructions (alpha * x + y, four elements per vectorised load), e.g.:")
    for line in fused[:4]:
        print("   ", line)
    print(f"{len(loads)} 128-bit loads (LDG.E.128), e.g.:", loads[0] if loads else "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
