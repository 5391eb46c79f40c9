"""The benchmarks: each module is a script (``python -m benchmarks.NAME``, from the repository
root) that measures one claim of docs/performance.md or docs/guarantees.md. Not part of the
wheel. The reliability tests run the CI-sized form of ``chaos``, ``node_loss`` and
``overload`` by importing them as this package (pytest puts the repository root on the path).
"""
