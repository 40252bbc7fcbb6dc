"""`config_error`: the one formatter of pydantic errors into mentor's one-line ConfigError."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from mentor.pipeline.errors import ConfigError, config_error
from mentor.stages.build import BuildConfig
from mentor.stages.hint.config import load_config
from mentor.stages.mine import MineConfig


def _error(model, **kwargs) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        model(**kwargs)
    return info.value


def test_names_the_file_the_field_path_what_was_found_and_the_fix():
    err = config_error(_error(MineConfig, k_failed=-1, k_faild=3), "wf.yaml", prefix="mine")
    assert isinstance(err, ConfigError) and err.exit_code == 2
    assert str(err) == ("wf.yaml: mine.k_failed: Input should be greater than or equal to 0 (found: -1); "
                        "mine.k_faild: unknown key (remove it or fix its spelling)")


def test_flags_are_named_as_the_user_typed_them():
    exc = _error(MineConfig, min_rollouts=0, failed_budget_chars=3)
    assert str(config_error(exc, flags={"failed_budget_chars": "--failed-budget"})) == (
        "--min-rollouts: Input should be greater than or equal to 1 (found: 0); "
        "--failed-budget: Input should be greater than or equal to 64 (found: 3)")


def test_a_model_level_check_keeps_its_own_words_without_pydantic_prefix():
    exc = _error(BuildConfig, base="gsm8k", shard_rows=10, shard_bytes=4096)
    assert str(config_error(exc, "wf.yaml", prefix="build")) == "wf.yaml: build: give --shard-rows or --shard-bytes, not both"
    assert str(config_error(exc)) == "give --shard-rows or --shard-bytes, not both"


def test_a_long_value_is_cut_and_a_value_already_quoted_is_not_repeated():
    long = "x" * 500
    msg = str(config_error(_error(BuildConfig, base="gsm8k", placement=long)))
    assert msg.startswith("placement: Input should be ") and msg.endswith("...)") and len(msg) < 300
    msg = str(config_error(_error(MineConfig, correct_col=None)))
    assert msg == "correct_col: Input should be a valid string (found: None)"


def test_hint_config_file(tmp_path):
    path = tmp_path / "hint.yaml"
    path.write_text(yaml.safe_dump({"hint": {"max_retyr": 2}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: invalid hint config: max_retyr: unknown key (remove it or fix its spelling)"


def test_a_secret_is_never_echoed():
    from pydantic import BaseModel

    class Server(BaseModel):
        api_key: int

    msg = str(config_error(_error(Server, api_key="sk-live-123"), "server.yaml"))
    assert msg == "server.yaml: api_key: Input should be a valid integer, unable to parse string as an integer"
