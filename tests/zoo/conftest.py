"""The zoo tests import their helpers (zoo_harness.py, zoo_models.py) from this folder."""
