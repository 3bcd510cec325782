"""Acceptance and fault tools, beside the benchmarks (they check, where the benchmarks measure).

* ``python -m tools.gpu_check`` (``make gpu-check``): the GPU acceptance check, exactness and timing on one GPU.
* ``python -m tools.soak`` (``make soak``): randomized kill -9 trials over the smoke experiment, records checked.
"""
