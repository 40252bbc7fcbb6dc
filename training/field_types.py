"""The types of a trainer's own settings, checked before launch against the trainer's own schema.

A round config passes fields straight to the trainer: TRL's ``GRPOConfig`` (a dataclass whose
annotations are its schema) and verl's Hydra overrides (whose schema is verl's packaged
``ppo_trainer.yaml``: each key's default says its type). Neither trainer checks the type when it
is given, so ``max_steps: ten`` or ``trainer.total_epochs: one`` would pass a dry run and fail (or
misbehave) hours later. Here a value of the wrong type is a `ConfigError` naming the key, the
value and the type wanted.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pydantic import TypeAdapter, ValidationError

from mentor.pipeline.errors import ConfigError

# Seeds that the trainers hand to numpy (``np.random.seed``: 0 to 2**32 - 1); outside it transformers' set_seed fails
# when training starts.
NUMPY_SEED_MAX = 2**32 - 1
SEED_FIELDS = ("seed", "data_seed")


def type_name(t: Any) -> str:
    """A type as a user reads it: ``int``, ``float | None``, ``list[float] | None``."""
    return t.__name__ if isinstance(t, type) and not typing.get_args(t) else str(t).replace("typing.", "")


def _as_text_hint(value: Any, adapter: TypeAdapter) -> str:
    """Why a text value failed where a number is wanted: YAML reads ``1e-6`` as text (it wants ``1.0e-6``)."""
    if isinstance(value, str):
        try:
            adapter.validate_python(value)  # the text would read as the type: it was meant as a number
        except ValidationError:
            return ""
        return "; YAML read it as text: write the number without quotes (and 1e-6 as 1.0e-6, which YAML reads as a number)"
    return ""


def check_dataclass_values(cls: type, values: dict[str, Any], where: str, owner: str) -> None:
    """Each of `values` against the annotation of `cls`'s field of that name (strictly: no text for a number,
    no true/false for a count); `owner` names the schema in the message (``TRL 1.16.0's GRPOConfig``)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation this Python cannot resolve: the trainer's own checks stand
        return
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    for key, value in values.items():
        if key not in fields or key not in hints:
            continue
        try:
            adapter = TypeAdapter(hints[key])
        except Exception:  # a type pydantic cannot build a check for
            continue
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError:
            raise ConfigError(f"{where}: {key} {value!r}: must be {type_name(hints[key])} ({owner}.{key})"
                              f"{_as_text_hint(value, adapter)}") from None
        if key in SEED_FIELDS and isinstance(value, int) and not 0 <= value <= NUMPY_SEED_MAX:
            raise ConfigError(f"{where}: {key} {value}: must be 0 to {NUMPY_SEED_MAX} (2**32 - 1): the trainer seeds "
                              "numpy with it, which takes no other value; pick a seed in that range")


_SCALARS: dict[type, tuple[tuple[type, ...], str]] = {
    bool: ((bool,), "true or false"),
    int: ((int,), "a whole number"),
    float: ((int, float), "a number"),
}


def check_override_types(overrides: dict[str, Any], base: Any, typed: dict[str, Any], where: str) -> None:
    """verl overrides against verl's packaged config `base` (composed with no overrides): where a key's default is
    true/false, a whole number or a number, the value (as Hydra types it: `typed`, key -> value) must be one too.
    Keys verl's config does not have, ``~`` deletions, nulls (given or default) and interpolations are left to verl."""
    from omegaconf import OmegaConf  # verl's config library (present wherever `base` could be composed)

    for key, value in typed.items():
        default = OmegaConf.select(base, key, default=None, throw_on_resolution_failure=False)
        if OmegaConf.is_config(default) or default is None:
            continue
        want = next((spec for t, spec in _SCALARS.items() if type(default) is t), None)
        if want is None or value is None or (isinstance(value, str) and "${" in value):  # null: verl's to judge
            continue
        kinds, text = want
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            given = overrides.get(key, value)
            raise ConfigError(f"{where}: overrides.{key} {given!r}: must be {text} (verl's default is {default!r})")
