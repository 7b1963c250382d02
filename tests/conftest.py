"""Fixtures shared by all test directories."""
import os

import pytest


def _read_json_files(root) -> dict:
    """``{path relative to root: bytes}`` of every ``.json`` file below ``root``."""
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(".json"):
                path = os.path.join(directory, name)
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, root)] = handle.read()
    return out


@pytest.fixture
def json_files():
    """``json_files(root)``: the bytes of every ``.json`` file below ``root`` by relative
    path (two exports of the same rows compared byte for byte)."""
    return _read_json_files
