"""Fixtures of the PyTorch recorder tests (helpers live in pt_helpers.py: a module named
conftest would clash with the other test folders' conftest modules on import)."""
from pt_helpers import memo_all_sizes, quickstart  # noqa: F401  (fixtures)
