"""Benchmark, cost model and recommendation: the field report's method and tables as a CLI (`gguf-serve-bench`)."""
