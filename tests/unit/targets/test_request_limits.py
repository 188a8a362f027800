"""A target refuses a request its engine cannot serve: the prompt and new tokens beyond
max_model_len, a padded continuous-batching prompt, a static-batching warmup shape."""

import pytest

from harness.core.config import ConfigError, WarmupShape
from harness.targets import target_for
from tests.bad_input import cfg


def test_prompt_longer_than_max_model_len():
    with pytest.raises(ConfigError, match=r"prompt of 250 tokens \+ max_tokens 16 exceeds max_model_len 256"):
        target_for(cfg()).check_request(250, 16)


def test_spyre_cb_counts_the_padded_prompt():
    t = target_for(cfg(target="spyre", mode="cb", backend="eager", stack="spyre-1.10"))
    t.check_request(192, 64)  # exactly fits
    with pytest.raises(ConfigError, match=r"padded to 256.*exceeds max_model_len 256"):
        t.check_request(193, 1)


def test_static_batching_prompt_must_fit_warmup_shape():
    t = target_for(cfg(target="spyre", mode="sb", backend="eager", warmup=WarmupShape(64, 20, 2),
                         stack="spyre-1.10"))
    t.check_request(64, 20)
    with pytest.raises(ConfigError, match=r"does not fit the static-batching warmup shape \(prompt_len 64"):
        t.check_request(65, 20)
    with pytest.raises(ConfigError, match="new_tokens 20"):
        t.check_request(10, 21)
