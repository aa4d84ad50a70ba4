"""One rule for every ``NVFP4_OPS_*`` switch (:mod:`nvfp4_ops._env`): the same spellings
everywhere, read at use, anything else refused by name with the value seen."""

from __future__ import annotations

import pytest

from nvfp4_ops import _env
from nvfp4_ops._env import NVFP4EnvError

NAME = "NVFP4_OPS_TEST_SWITCH"


@pytest.mark.parametrize("value", ["1", "true", "YES", " On ", "True\n"])
def test_flag_true_spellings(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    assert _env.flag(NAME, False) is True


@pytest.mark.parametrize("value", ["0", "false", "No", "  OFF"])
def test_flag_false_spellings(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    assert _env.flag(NAME, True) is False


@pytest.mark.parametrize("value", [None, "", "   "])
def test_flag_unset_or_empty_is_the_default(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, value)
    assert _env.flag(NAME, True) is True
    assert _env.flag(NAME, False) is False


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "y"])
def test_flag_refuses_other_values_by_name(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    with pytest.raises(NVFP4EnvError,
                       match=rf"{NAME} must be one of 1, true, yes, on / 0, false, no, off, "
                             rf"got '{value}'"):
        _env.flag(NAME, False)


def test_env_error_is_a_value_error():
    assert issubclass(NVFP4EnvError, ValueError)


def test_read_at_use_not_at_import(monkeypatch):
    monkeypatch.setenv(NAME, "1")
    assert _env.flag(NAME, False)
    monkeypatch.setenv(NAME, "0")
    assert not _env.flag(NAME, False)


def test_lookup_sees_every_way_of_setting_a_variable(monkeypatch):
    """The fast lookup reads what ``os.environ`` holds, however it was written."""
    import os
    from unittest import mock

    monkeypatch.delenv(NAME, raising=False)
    assert _env.lookup(NAME) is None
    os.environ[NAME] = "on"
    try:
        assert _env.lookup(NAME) == "on" and _env.flag(NAME, False) is True
    finally:
        del os.environ[NAME]
    assert _env.lookup(NAME) is None
    with mock.patch.dict(os.environ, {NAME: "  Off"}):
        assert _env.lookup(NAME) == os.environ.get(NAME) == "  Off"
    assert _env.lookup(NAME) is None
    monkeypatch.setenv(NAME, "caf\u00e9")
    assert _env.lookup(NAME) == "caf\u00e9"


def test_choice(monkeypatch):
    choices = ("reuse", "per-call")
    monkeypatch.delenv(NAME, raising=False)
    assert _env.choice(NAME, choices, "reuse") == "reuse"
    monkeypatch.setenv(NAME, " Per-Call ")
    assert _env.choice(NAME, choices, "reuse") == "per-call"
    monkeypatch.setenv(NAME, "sometimes")
    with pytest.raises(NVFP4EnvError,
                       match=rf"{NAME} must be 'reuse' or 'per-call', got 'sometimes' "
                             r"\(any case; unset or empty means 'reuse'\)"):
        _env.choice(NAME, choices, "reuse")


def test_auto_flag(monkeypatch):
    for value, want in (("", None), ("AUTO", None), ("on", True), ("1", True), ("no", False)):
        monkeypatch.setenv(NAME, value)
        assert _env.auto_flag(NAME) is want, value
    monkeypatch.setenv(NAME, "sometimes")
    with pytest.raises(NVFP4EnvError, match=rf"{NAME} must be 'auto' or one of .*'sometimes'"):
        _env.auto_flag(NAME)


def test_path(monkeypatch, tmp_path):
    monkeypatch.setenv(NAME, "  ")
    assert _env.path(NAME) is None
    monkeypatch.setenv(NAME, f" {tmp_path} ")
    assert _env.path(NAME) == str(tmp_path)


def test_backend(monkeypatch):
    monkeypatch.delenv(_env.BACKEND, raising=False)
    assert _env.backend() == "auto"
    monkeypatch.setenv(_env.BACKEND, "Reference")
    assert _env.backend() == "reference"
    monkeypatch.setenv(_env.BACKEND, "bogus")
    with pytest.raises(NVFP4EnvError,
                       match=r"NVFP4_OPS_BACKEND must be 'auto' or 'reference', got 'bogus'"):
        _env.backend()


def test_every_switch_of_the_package_is_documented():
    """Each ``NVFP4_OPS_*`` name used in the package or the glue is listed in ``_env``'s
    docstring (the one place a user looks them up)."""
    import re
    from pathlib import Path

    root = Path(_env.__file__).resolve().parents[1]
    used = set()
    for folder in ("nvfp4_ops", "model_glue"):
        for p in (root / folder).rglob("*.py"):
            used |= set(re.findall(r"NVFP4_OPS_[A-Z0-9_]*[A-Z0-9]", p.read_text()))
    assert used, "no switches found"
    missing = sorted(n for n in used if f"``{n}``" not in _env.__doc__)
    assert not missing, missing
