"""The benchmark harness: ``make bench`` (quick) and ``make bench-full``; see BENCHMARKS.md."""
