"""Shared fixtures: real data locations and small canonical datasets."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# Nothing is fetched from a model or dataset hub, ever.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
# ../shared/data beside the checkout (CI lays it there); MENTOR_SHARED_DATA overrides.
SHARED_DATA = Path(os.environ.get("MENTOR_SHARED_DATA", REPO.parent / "shared" / "data"))
GSM8K_EXAMPLE = SHARED_DATA / "gsm8k" / "example_model_solutions.jsonl"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (set MENTOR_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def gsm8k_example(shared_data) -> Path:
    return GSM8K_EXAMPLE


@pytest.fixture(scope="session")
def bundled_rollouts() -> Path:
    from mentor.data import bundled

    return bundled("gsm8k_rollouts.parquet")


@pytest.fixture(scope="session")
def gsm8k_collapsed(tmp_path_factory, bundled_rollouts) -> Path:
    """collapsed.parquet mined from the bundled real GSM8K rollouts (432 rows)."""
    from mentor.stages.mine import MINE, MineConfig

    out = tmp_path_factory.mktemp("collapsed")
    MINE({"sources": [str(bundled_rollouts)]}, MineConfig(), out)
    return out / "collapsed.parquet"


@pytest.fixture(scope="session")
def policy_model() -> str:
    """A model folder with a tokenizer and chat template (the embedded SmolLM2): launchers measure prompts with it."""
    from mentor.pipeline.models import ensure_embedded_model

    return str(ensure_embedded_model())


@pytest.fixture(scope="module")
def tokenizer():
    """The embedded SmolLM2's tokenizer (a real chat template); skips where the model package is missing."""
    from transformers import AutoTokenizer

    from mentor.pipeline.models import ensure_embedded_model

    try:
        path = ensure_embedded_model()
    except Exception as exc:  # the model package is part of the cpu extra
        pytest.skip(f"embedded model unavailable: {exc}")
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def trainable_llama(tmp_path_factory) -> str:
    """A 2-layer random Llama with the embedded SmolLM2's tokenizer (tests/tiny_model.py): real shapes, seconds per step."""
    from tiny_model import make_trainable_llama

    try:
        out = make_trainable_llama(tmp_path_factory.mktemp("tiny-llama"))
    except Exception as exc:  # the embedded model's package is part of the cpu extra
        pytest.skip(f"embedded model unavailable: {exc}")
    return str(out)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (on a shared 2-core machine, 1 thread is the fast setting for a tiny model)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bench(request):
    """The benchmark script the test module names in ``BENCH`` (tests/benchmarks/), loaded by path as a module."""
    path = request.module.BENCH
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def gsm8k_prompts(tmp_path_factory) -> str:
    """`mentor build --base gsm8k` (1,319 unhinted prompts): what a round trains on."""
    from mentor.stages.build import BUILD, BuildConfig

    out = tmp_path_factory.mktemp("gsm8k-prompts") / "prompts"
    BUILD({}, BuildConfig(base="gsm8k", round=0), out)
    return str(out)


@pytest.fixture(params=["default", "legacy"])
def backend_kind(request, monkeypatch):
    """The code sandbox's backend: the machine's (bubblewrap where it works), and the legacy fallback explicitly."""
    from mentor.training import sandbox
    from mentor.training.sandbox import launch as sandbox_launch

    if request.param == "legacy":
        impl = sandbox_launch.Legacy()
        seen = sandbox.probe_backend(impl)
        assert seen is not None, "the legacy backend does not start here"
        monkeypatch.setattr(sandbox, "_BACKEND", sandbox.Backend(impl, sandbox.verified_layers(*seen), seen[1]))
    return sandbox.backend().name
