"""episerve benchmarks: every figure of the performance targets, side by side with its peers, in one run.

Run `python -m bench.run --quick` (a few minutes) or `python -m bench.run` (full size). See docs/performance.md.
"""
