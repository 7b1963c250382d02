"""msprobe: precision-debugging recorder. Importing ``msprobe`` imports no framework and
no compare machinery; ``msprobe.compare(target, baseline, **options)`` loads the compare
engine on first use (see :func:`msprobe.compare.compare`)."""
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "compare":
        import importlib

        return importlib.import_module("msprobe.compare")
    raise AttributeError(f"module 'msprobe' has no attribute {name!r}")
