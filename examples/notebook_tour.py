"""A tour of the notebook habits, in cells (`# %%`, as VS Code, Spyder and jupytext read them):
constructors, host indexing, arithmetic and comparisons, NumPy-style methods, the notebook
display and DLPack. Every cell checks its results against numpy.

    python examples/notebook_tour.py

Run as a script, it prints what each cell found; with no GPU it says so and exits with
status 0 (there is nothing to run, which is no failure for a notebook).
"""

# %% A place group: every visible GPU, one place each
import numpy as np

import cuda_sharded_jit as sharded

try:
    group = sharded.PlaceGroup.by_devices()
except RuntimeError as error:
    print(f"notebook_tour: no CUDA GPU is visible, so there is nothing to run ({error})")
    raise SystemExit(0) from None


def show(value) -> None:
    """In a notebook, the rich display (_repr_html_); in a script, the plain repr."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(value)
    else:
        print(repr(value))


show(group)

# %% Constructors with NumPy's names
n = 100_000
zeros = sharded.zeros(group, n, np.float32)
ramp = sharded.arange(group, n, dtype=np.float64)
unit = sharded.linspace(group, 0.0, 1.0, n)
rng = np.random.default_rng(0)
x_host = rng.random(n)
x = sharded.asarray(group, x_host)
np.testing.assert_array_equal(zeros.to_numpy(), np.zeros(n, np.float32))
np.testing.assert_array_equal(ramp.to_numpy(), np.arange(n, dtype=np.float64))
np.testing.assert_allclose(unit.to_numpy(), np.linspace(0.0, 1.0, n), rtol=0, atol=1e-15)
assert unit[-1] == 1.0  # the last element is stop exactly
np.testing.assert_array_equal(x.to_numpy(), x_host)
print(f"zeros, arange, linspace, asarray: {n} elements in shards of {x.shard_sizes}")

# %% Host indexing: only the elements touched are copied
assert x[3] == x_host[3] and x[-1] == x_host[-1]
np.testing.assert_array_equal(x[10:20], x_host[10:20])
mask = x_host > 0.99
np.testing.assert_array_equal(x[mask], x_host[mask])
x[5] = 0.25
x_host[5] = 0.25
assert x[5] == 0.25
print(f"x[3] = {x[3]:.4f}, x[-1] = {x[-1]:.4f}, x[10:20] read, {mask.sum()} masked elements read, x[5] written")

# %% Arithmetic and comparisons, elementwise on the GPUs, with NumPy's result types
y_host = 1.0 + unit.to_numpy()  # in [1, 2]: no division by zero
y = 1.0 + unit
z = (x * 2 + 1) / y
np.testing.assert_allclose(z.to_numpy(), (x_host * 2 + 1) / y_host, rtol=1e-15)
above = x > 0.5  # a uint32 array of 1 / 0 (arrays hold no bool)
assert above.dtype == np.uint32
np.testing.assert_array_equal(above.to_numpy(), (x_host > 0.5).astype(np.uint32))
count = int(above.sum())
assert count == int((x_host > 0.5).sum())
kept = x[above.to_numpy().astype(bool)]  # a host mask; without astype, 0 / 1 would be positions
np.testing.assert_array_equal(kept, x_host[x_host > 0.5])
both = (x > 0.25) * (0.75 >= x)  # 1 where both hold; 0.75 >= x is x <= 0.75
assert int(both.sum()) == int(((x_host > 0.25) & (x_host <= 0.75)).sum())
print(f"(x * 2 + 1) / y: {z.dtype}; x > 0.5 holds for {count} of {n} elements")

# %% copy, astype and the one-pass statistics
copied = x.copy()
assert copied is not x and copied.shard_sizes == x.shard_sizes
single = x.astype(np.float32)
np.testing.assert_array_equal(single.to_numpy(), x_host.astype(np.float32))
np.testing.assert_allclose(x.mean(), x_host.mean(), rtol=1e-12)
np.testing.assert_allclose(x.std(), x_host.std(), rtol=1e-10)
np.testing.assert_allclose(x.sum(), x_host.sum(), rtol=1e-12)
print(f"mean {x.mean():.6f}, std {x.std():.6f} (numpy: {x_host.mean():.6f}, {x_host.std():.6f})")

# %% The notebook display: a table of the shards
html = x._repr_html_()
assert "<table>" in html and f"{n} elements" in html
show(x)

# %% DLPack: a shard read in place by torch (when torch is installed and views speak DLPack)
try:
    import torch
except ImportError:
    print("DLPack: torch is not installed; skipped")
else:
    if hasattr(sharded.ShardView, "__dlpack__"):
        tensor = torch.from_dlpack(x.shard(0))  # zero-copy, ordered after our stream's work
        np.testing.assert_array_equal(tensor.cpu().numpy(), x_host[:x.shard_sizes[0]])
        print(f"DLPack: torch reads shard 0 in place: {tuple(tensor.shape)} on {tensor.device}")
    else:
        print("DLPack: this build's shard views have no __dlpack__; skipped")

# %%
print("notebook_tour: every cell matches numpy")
