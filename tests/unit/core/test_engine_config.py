"""An EngineConfig refuses an unknown target, mode or backend and a bad Spyre geometry,
naming the value and the known ones."""

import re

import pytest

from harness.core.config import ConfigError, WarmupShape
from harness.targets import KINDS, engine_kinds
from tests.bad_input import cfg


def test_unknown_target_names_the_known_ones():
    unknown = "not-a-kind"
    assert unknown not in KINDS
    known = re.escape(", ".join(engine_kinds()))
    with pytest.raises(ConfigError, match=rf"unknown target '{unknown}'.*{known}"):
        cfg(target=unknown)


def test_unknown_spyre_mode_and_backend():
    with pytest.raises(ConfigError, match=r"unknown spyre mode 'xx'.*sb, cb, cp"):
        cfg(target="spyre", mode="xx", backend="eager")
    with pytest.raises(ConfigError, match=r"unknown spyre backend 'gpu'.*eager, sendnn"):
        cfg(target="spyre", mode="cb", backend="gpu")


def test_mode_on_a_target_without_modes():
    with pytest.raises(ConfigError, match="takes no mode"):
        cfg(mode="cb")


def test_spyre_geometry_is_checked():
    with pytest.raises(ConfigError, match="not a multiple of the 64-token KV block"):
        cfg(target="spyre", mode="cb", backend="eager", max_model_len=200)
    with pytest.raises(ConfigError, match="max_num_batched_tokens a multiple of 64"):
        cfg(target="spyre", mode="cp", backend="eager", max_num_batched_tokens=100)
    with pytest.raises(ConfigError, match="warmup prompt length 100 is not a multiple of 64"):
        cfg(target="spyre", mode="sb", backend="eager", warmup=WarmupShape(100, 20, 2))
