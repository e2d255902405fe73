"""The test bed that the tests and the benchmarks share: the real servers, the bridge as a process,
a workload, the checker of every record's fate, and the chaos scenarios built on them."""
