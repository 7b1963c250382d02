"""Property: any ``PrecisionDebugger(...)`` arguments, and any model given
to ``start()``, give either a working debugger or a ``ConfigError`` that names the field,
the value and what is allowed: never another exception. (Arbitrary config.json documents:
``tests/core/test_config.py``.)"""
from __future__ import annotations

import json
import os
import re

import pytest
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msprobe.core.config import Config
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger

MESSAGE = re.compile(r"config field `[^`]+`: got .*; allowed: ", re.DOTALL)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)
odd_objects = st.sampled_from([object(), b"bytes", 3 + 4j, nn.Linear, range(3), {1, 2}, ...])
modules = st.sampled_from([nn.Linear(2, 2), nn.Sequential(nn.ReLU())])
models = (st.none() | modules | st.lists(modules | json_values, max_size=3) | st.tuples(modules, modules)
          | json_values | odd_objects)
config_paths = st.sampled_from(["CONFIG", "BADJSON", "DIR", "MISSING", None]) | json_values | odd_objects
arguments = st.fixed_dictionaries({}, optional={
    "config_path": config_paths,
    "task": st.sampled_from(["statistics", "tensor", "structure", "overflow_check"]) | json_values | odd_objects,
    "dump_path": st.sampled_from(["DUMP", "DUMP/sub", "FILE/x", ""]) | json_values | odd_objects,
    "level": st.sampled_from(["L0", "L1", "L2", "mix", "debug"]) | json_values | odd_objects,
    "step": st.lists(st.integers(-1, 4) | st.sampled_from(["0-2", "2-0", "x"]), max_size=3) | json_values
    | odd_objects,
    "model": models,
})


def _place(value, tmp_path):
    if isinstance(value, str):
        for token, real in (("CONFIG", "config.json"), ("BADJSON", "bad.json"), ("DIR", "adir"),
                            ("MISSING", "missing.json"), ("DUMP", "dump"), ("FILE", "file")):
            if value.startswith(token):
                return str(tmp_path / (real + value[len(token):]))
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kwargs=arguments, start_model=models)
def test_debugger_arguments_give_a_debugger_or_a_config_error(tmp_path_factory, kwargs, start_model):
    tmp_path = tmp_path_factory.mktemp("args")
    (tmp_path / "config.json").write_text(json.dumps({"dump_path": str(tmp_path / "from_file")}))
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "adir").mkdir()
    (tmp_path / "file").write_text("x")
    kwargs = {k: _place(v, tmp_path) for k, v in kwargs.items()}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a generated relative dump_path ("¦") lands here, not in the repository
    try:
        _construct_and_run(kwargs, start_model)
    finally:
        os.chdir(cwd)


def _construct_and_run(kwargs: dict, start_model) -> None:
    try:
        dbg = PrecisionDebugger(**kwargs)
    except ConfigError as err:
        assert MESSAGE.match(str(err)), str(err)
        assert err.field
        return
    try:
        assert isinstance(dbg.config, Config)
        try:
            dbg.start(start_model)
        except ConfigError as err:
            assert MESSAGE.match(str(err)) and err.field == "model", str(err)
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()


@pytest.mark.parametrize("model, field", [
    (3, "model"), ([], "model"), ([nn.Linear(1, 1), "x"], "model"), (nn.Linear, "model"),
])
def test_bad_model_names_the_field(tmp_path, model, field):
    with pytest.raises(ConfigError, match=rf"config field `{field}`: got .*; allowed: a torch.nn.Module"):
        PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L0", model=model)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    with pytest.raises(ConfigError, match=rf"config field `{field}`"):
        dbg.start(model)
    dbg.close()
