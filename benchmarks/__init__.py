"""Measurements that are not tests: ``python -m benchmarks`` (``make bench``) runs them all and prints one table.

* ``benchmarks/observation_bench.py``: the cost of observing (overhead vs a plain forward, the naive baseline, memory
  scaling, training overhead, eigendecomposition and figure time, GPU rows where a GPU exists).
* ``benchmarks/spectral_bench.py``: the streaming-covariance engine alone (rows/s vs a bare matmul, naive store+cov).

See ``docs/benchmarks.md`` for what each row means and the figures measured on the development machine.
"""
