"""What an operator became: LTO-IR size, cubin, SASS (works without a GPU).

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
    print(f"operator LTO-IR: {len(kernel.ltoir)} bytes; linked cubin: {len(kernel.cubin)} bytes; "
          f"cache hit: {kernel.cache_hit}")
    sass = kernel.sass()
    print("inlined (no CALL in SASS):", "CALL" not in sass)
    print("\n".join(line.strip() for line in sass.splitlines() if "FFMA" in line or "LDG" in line)[:800])
    return 0


if __name__ == "__main__":
    sys.exit(main())
