"""Measurements that are not tests: ``python -m benchmarks`` (``make bench``) runs them all and prints one table.

``observation_bench`` (rows 1-9) drives the run and calls ``attention_bench``, ``summary_bench`` (rows 10),
``scale_bench`` (11), ``optimisation_bench`` (12) and ``curvature_bench`` (13); ``spectral_bench`` measures the
streaming-covariance engine alone in its own process. ``_table`` holds the one row registry and table renderer,
``_harness`` the models, images, timing and memory measurement they share. ``seed_replication`` (``make seeds``)
scores single-run verdicts across seeds. The acceptance and fault tools are beside them, in ``tools/``.

See ``docs/benchmarks.md`` for what each row means and the figures measured on the development machine.
"""
