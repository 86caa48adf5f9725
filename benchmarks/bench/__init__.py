"""The benchmarks of benchmarks/run.py, one module per section (run.py is the entry point)."""
