"""Packaging and set-up: README's commands, .ci/run, pyproject.toml, the shipped config."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUP = "python3 -m venv .venv && .venv/bin/pip install -r requirements-test.txt -e ."
EXAMPLE_CMD = f"{SETUP} && .venv/bin/python examples/char_lm.py"
TEST_CMD = f"{SETUP} && .venv/bin/python -m pytest -q"


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _readme_commands() -> list[str]:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()][:2]


def test_readme_starts_with_the_two_commands():
    assert _readme_commands() == [EXAMPLE_CMD, TEST_CMD]


def test_ci_runs_the_readme_test_command(tmp_path):
    """.ci/run executes exactly README's second command: run it with `bash` stubbed out
    to print its arguments instead of running them."""
    ci = REPO / ".ci" / "run"
    assert os.access(ci, os.X_OK)
    text = ci.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake_bash = fake_bin / "bash"
    fake_bash.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake_bash.chmod(0o755)
    script = text.replace("bash -euo pipefail -c", f"{fake_bash} -euo pipefail -c")
    assert script != text, "run the command with `bash -euo pipefail -c`"
    # the copy reads README.md from the repository root (it cds to the script's parent's parent)
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text(script)
    (tmp_path / "README.md").write_text((REPO / "README.md").read_text(encoding="utf-8"))
    out = subprocess.run(["/bin/bash", str(tmp_path / ".ci" / "run")], capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert out[-1] == TEST_CMD == _readme_commands()[1]


def test_root_config_is_the_shipped_default():
    root = json.loads((REPO / "config.json").read_text(encoding="utf-8"))
    shipped = json.loads((REPO / "msprobe" / "config.json").read_text(encoding="utf-8"))
    assert root == shipped
    from msprobe.core.config import DEFAULT_CONFIG_PATH

    assert Path(DEFAULT_CONFIG_PATH) == (REPO / "msprobe" / "config.json").resolve()


def test_project_metadata():
    project = _pyproject()["project"]
    assert project["name"] == "msprobe-recorder"
    assert project["dependencies"] == [
        "numpy>=1.24", "pyarrow>=14", "duckdb>=1.0", "pyyaml>=6", "safetensors>=0.4", "isal>=1.0",
        "xxhash>=3.0", "tqdm>=4.66",
    ]
    extras = project["optional-dependencies"]
    assert extras["torch"] == ["torch>=2.1"]
    assert extras["mindspore"] == ["mindspore>=2.10", "numpy<2"]
    assert extras["test"] == ["pytest>=7", "hypothesis>=6"]
    assert extras["tensorboard"] == ["tensorboard>=2.12"]


def test_package_data_is_declared_and_present():
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    assert data == {"msprobe": ["*.json"], "msprobe.pytorch": ["*.yaml"], "msprobe.mindspore": ["*.yaml"],
                    "msprobe.compare": ["*.yaml"], "msprobe.report": ["*.js", "*.css", "vendor/*"]}
    assert (REPO / "msprobe" / "config.json").is_file()
    assert list((REPO / "msprobe" / "report").glob("*.js")) and list((REPO / "msprobe" / "report").glob("*.css"))
    # the vendored graph layout library and its licence
    import hashlib

    from msprobe.report.page import DAGRE_SHA256, DAGRE_VERSION
    dagre = (REPO / "msprobe" / "report" / "vendor" / "dagre.min.js").read_bytes()
    assert hashlib.sha256(dagre).hexdigest() == DAGRE_SHA256 and f'var re="{DAGRE_VERSION}"'.encode() in dagre
    assert "MIT" in (REPO / "msprobe" / "report" / "vendor" / "dagre.LICENSE").read_text() or \
        "Permission is hereby granted" in (REPO / "msprobe" / "report" / "vendor" / "dagre.LICENSE").read_text()
    assert (REPO / "msprobe" / "pytorch" / "support_wrap_ops.yaml").is_file()
    assert (REPO / "msprobe" / "mindspore" / "support_wrap_ops.yaml").is_file()
    assert (REPO / "msprobe" / "compare" / "ms_pt_table.yaml").is_file()


def test_console_script_resolves():
    target = _pyproject()["project"]["scripts"]["msprobe"]
    assert target == "msprobe.cli:main"
    module_name, _, attr = target.partition(":")
    main = getattr(importlib.import_module(module_name), attr)
    assert main(["--help"]) == 0
    assert main(["no-such-command"]) == 2


def test_installed_console_script_runs():
    """Where the package is installed (README's `pip install -e .`), `msprobe` is on PATH
    beside the interpreter and answers --help."""
    script = Path(sys.executable).parent / "msprobe"
    if not script.exists():
        pytest.skip("msprobe-recorder is not installed in this interpreter's environment")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "export" in proc.stdout and "query" in proc.stdout


def test_benchmarks_are_not_collected():
    pytest_cfg = _pyproject()["tool"]["pytest"]["ini_options"]
    assert pytest_cfg["testpaths"] == ["tests"]
    assert "benchmarks" in pytest_cfg["norecursedirs"]
    assert ".*" in pytest_cfg["norecursedirs"]


def test_requirements_pin_torch_and_numpy():
    lines = [line.split("#")[0].strip() for line in
             (REPO / "requirements-test.txt").read_text(encoding="utf-8").splitlines()]
    reqs = {line for line in lines if line}
    assert {"torch==2.13.0", "numpy<2", "pyarrow<=25"} <= reqs
