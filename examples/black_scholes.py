"""A custom elementwise operator with runtime scalar parameters: Black-Scholes call prices.

    python examples/black_scholes.py

Rate and volatility are runtime arguments: pricing again with new values does not recompile.
"""

import math
import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


@sharded.op
def call_price(spot, strike, years, rate, volatility):
    sqrt_t = math.sqrt(years)
    d1 = (math.log(spot / strike) + (rate + 0.5 * volatility * volatility) * years) / (volatility * sqrt_t)
    d2 = d1 - volatility * sqrt_t
    cdf1 = 0.5 * math.erfc(-d1 / math.sqrt(2.0))
    cdf2 = 0.5 * math.erfc(-d2 / math.sqrt(2.0))
    return spot * cdf1 - strike * math.exp(-rate * years) * cdf2


def main() -> int:
    group = group_or_exit("black_scholes")
    rng = np.random.default_rng(0)
    n = 4_000_000
    spot_h = rng.uniform(50, 150, n)
    strike_h = rng.uniform(50, 150, n)
    years_h = rng.uniform(0.1, 2.0, n)
    spot, strike, years = (sharded.ShardedArray.from_numpy(group, h) for h in (spot_h, strike_h, years_h))
    for rate, volatility in ((0.01, 0.2), (0.05, 0.35)):
        prices = sharded.transform(call_price, spot, strike, years, rate, volatility).to_numpy()
        expected = np.array([call_price(*args, rate, volatility)
                             for args in zip(spot_h[:2000], strike_h[:2000], years_h[:2000])])
        np.testing.assert_allclose(prices[:2000], expected, rtol=1e-9, atol=1e-9)
        print(f"rate={rate}, vol={volatility}: mean call price {prices.mean():.4f} over {n} options")
    return 0


if __name__ == "__main__":
    sys.exit(main())
