"""``python -m benchmarks [--quick] [--out DIR] ...``: every benchmark, one table, results.json (see docs/benchmarks.md)."""

from benchmarks.observation_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
