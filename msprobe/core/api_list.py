"""Reading ``support_wrap_ops.yaml`` API lists: one loader for every adapter.

The file maps a YAML key (an API family's namespace) to a list of API names. Each adapter
says which keys it knows (``families``: key → ``(family prefix, resolve)`` where
``resolve()`` returns the object holding the APIs, or None / raises when that namespace
is not available), and gets back the resolvable APIs and the names it could not find.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import yaml

from msprobe.core.errors import ConfigError

logger = logging.getLogger("msprobe")

_ALLOWED = "a YAML mapping {family: [API names]} (support_wrap_ops.yaml format)"


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One hookable API: ``family`` prefix, ``api`` name, the ``owner`` object holding it."""

    family: str
    api: str
    owner: Any


def load_api_list(file: str, families: Mapping[str, tuple[str, Callable[[], Any]]], *,
                  framework: str, optional: frozenset[str] = frozenset(),
                  warn: bool = True) -> tuple[list[ApiSpec], list[str]]:
    """Read the API list ``file`` and resolve its names.

    Args:
        file: path of the YAML file.
        families: the adapter's known keys → ``(family prefix, resolve)``.
        framework: name used in the log message (``"PyTorch"``).
        optional: keys whose namespace may be absent (``torch_npu``): skipped quietly then.
        warn: log unknown names as a warning (else at info level).

    Returns ``(specs, unknown)``: names absent from the installed framework, and keys
    that are not a family, are reported in ``unknown`` (``"{key}.{name}"``), not fatal.

    Raises:
        ConfigError: the file cannot be read or parsed, or is not a mapping of lists.
    """
    try:
        with open(file, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("api_list", file, _ALLOWED, detail=f"cannot read: {exc}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, (list, type(None))) for v in doc.values()):
        raise ConfigError("api_list", file, _ALLOWED)
    specs: list[ApiSpec] = []
    unknown: list[str] = []
    for key, names in doc.items():
        fam = families.get(key)
        if fam is None:
            unknown.append(f"{key} (unsupported family; allowed: {', '.join(families)})")
            continue
        family, resolve = fam
        try:
            owner: Optional[Any] = resolve()
        except Exception:  # e.g. a communication package not usable in this build
            owner = None
        if owner is None:
            if key in optional:
                logger.debug("msprobe: %s is not installed; its %d API names are not hooked", key, len(names or []))
            else:
                unknown.extend(f"{key}.{name}" for name in names or [])
            continue
        for name in names or []:
            if not isinstance(name, str) or not callable(getattr(owner, name, None)):
                unknown.append(f"{key}.{name}")
                continue
            specs.append(ApiSpec(family, name, owner))
    if unknown:
        logger.log(logging.WARNING if warn else logging.INFO,
                   "msprobe: %d names of the API list %s are not in this %s and are not recorded: %s%s",
                   len(unknown), file, framework, ", ".join(unknown[:20]), ", ..." if len(unknown) > 20 else "")
    return specs, unknown
