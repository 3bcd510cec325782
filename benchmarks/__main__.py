"""``python -m benchmarks [--quick | --smoke] [--out DIR] ...``: every benchmark, one table, results.json.

See docs/benchmarks.md; ``--smoke`` checks that the benchmarks still run and measures nothing.
"""

from benchmarks.observation_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
