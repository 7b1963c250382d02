"""Framework-neutral core of msprobe: configuration, filters, errors.

Imports no deep-learning framework (design.md, "Data flow").
"""

from msprobe.core.config import Config, load_config
from msprobe.core.errors import ConfigError, MsprobeError
from msprobe.core.filters import DataMode, NameList, ScopeRange, parse_int_list

__all__ = [
    "Config",
    "ConfigError",
    "DataMode",
    "MsprobeError",
    "NameList",
    "ScopeRange",
    "load_config",
    "parse_int_list",
]
