"""Where the engines run: dask engine workers (devices, daemon flag), the OpenAI-server backend, thinking models.

The real engines (one vLLM CPU engine per dask worker, a real `vllm serve`) are in
test_engines_real.py; these tests use a real dask cluster and a real HTTP server of
the test's own, no engine.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mentor.pipeline.devices import engine_worker_env, local_gpus
from mentor.pipeline.errors import ConfigError, EngineError
from mentor.pipeline.backends.fake import FakeBackend
from mentor.pipeline.llm import BackendSpec, GenRequest, make_backend
from mentor.pipeline.stage import Context
from mentor.stages.hint import agents as hint_agents
from mentor.stages.hint.machine import hint_shard
from mentor.stages.hint.config import HintConfig

# ----------------------------------------------------------------------------- devices


def test_engine_workers_get_disjoint_gpus():
    eight = [str(i) for i in range(8)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in engine_worker_env(8, 1, gpus=eight)] == eight
    assert [e["CUDA_VISIBLE_DEVICES"] for e in engine_worker_env(2, 4, gpus=eight)] == ["0,1,2,3", "4,5,6,7"]
    with pytest.raises(ConfigError, match=r"need 12 GPUs, this node has 8 .*--workers 2"):
        engine_worker_env(3, 4, gpus=eight)
    # No GPU: each engine gets cores of its own.
    assert engine_worker_env(2, 1, gpus=[], cpus=[0, 1]) == [{"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"}]
    assert engine_worker_env(2, 1, gpus=[], cpus=[0, 1, 2, 3])[1] == {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}


def test_local_gpus_reads_the_fake_count_and_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "4")
    assert local_gpus() == ["0", "1", "2", "3"]
    monkeypatch.delenv("MENTOR_FAKE_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert local_gpus() == ["3", "5"]


def test_local_cluster_workers_can_start_engines_on_their_own_gpus(monkeypatch):
    """Each local worker may start child processes (vLLM's EngineCore) and sees only its own GPUs."""
    from mentor.pipeline.devices import worker_info
    from mentor.pipeline.executor import dask_client

    monkeypatch.setenv("MENTOR_FAKE_GPUS", "4")
    with dask_client(workers=2, gpus_per_worker=2) as client:
        views = client.run(worker_info)
    assert sorted(v["CUDA_VISIBLE_DEVICES"] for v in views.values()) == ["0,1", "2,3"]
    assert not any(v["daemon"] for v in views.values())
    monkeypatch.setenv("MENTOR_FAKE_GPUS", "2")
    with pytest.raises(ConfigError, match="need 4 GPUs, this node has 2"):
        with dask_client(workers=2, gpus_per_worker=2):
            pass


def test_engine_workers_own_a_share_of_the_memory_and_never_pause():
    """dask's default memory limit is RAM x threads / cores: a one-thread engine worker would pause at 80% of a few GiB
    (and never resume while its engine holds the memory). Each gets RAM / workers, no pause, no spill."""
    from distributed import system

    from mentor.pipeline.executor import dask_client, engine_memory_limit

    with dask_client(workers=1) as client:
        views = client.run(lambda dask_worker: (dask_worker.memory_manager.memory_limit,
                                                dask_worker.memory_manager.memory_pause_fraction,
                                                dask_worker.memory_manager.memory_spill_fraction,
                                                dask_worker.memory_manager.memory_target_fraction))
    (limit, pause, spill, target), = views.values()
    assert limit == engine_memory_limit(1) == system.MEMORY_LIMIT
    assert (pause, spill, target) == (False, False, False)
    assert engine_memory_limit(4) == system.MEMORY_LIMIT // 4


def test_a_shard_task_that_raised_is_not_run_again(tmp_path):
    """dask's retries would rerun a failed engine task on top of the engine it left (and fail the same way):
    a task that raised runs once, its error is the stage's, and the shard is redone by a rerun."""
    from mentor.pipeline.executor import DaskExecutor, dask_client

    def run_and_fail(path):  # local: dask pickles it by value
        with open(path, "a") as fh:
            fh.write("x")
        raise ValueError("this shard cannot be done")

    with dask_client(workers=1) as client, pytest.raises(ValueError, match="cannot be done"):
        DaskExecutor(client).map(run_and_fail, [str(tmp_path / "runs")])
    assert (tmp_path / "runs").read_text() == "x"


def test_a_daemonic_worker_says_how_to_start_engine_workers():
    """A cluster the user started with dask's defaults: one clear error instead of vLLM's AssertionError."""
    distributed = pytest.importorskip("distributed")

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        fut = client.submit(BackendSpec("vllm", "/nonexistent-model"), pure=False)
        with pytest.raises(ConfigError, match="DASK_DISTRIBUTED__WORKER__DAEMON=False"):
            fut.result()


# ----------------------------------------------------------------------------- the OpenAI-server backend


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def _serve(handler_answers):
    """A local HTTP server answering /v1/models and /v1/chat/completions with `handler_answers(body)`."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "t"}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            code, obj = handler_answers(body)
            self._send(code, obj)

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def _completion(text, finish="stop"):
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def test_server_backend_sends_seeds_schema_and_template_kwargs_and_keeps_order():
    server, seen = _serve(lambda body: (200, _completion(body["messages"][-1]["content"].upper())))
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        backend = make_backend("openai", "m", base_url=url, max_concurrency=3)
        schema = {"type": "object", "properties": {"hint": {"type": "string", "maxLength": 40}}}
        reqs = [GenRequest(f"r{i}", [{"role": "user", "content": f"q{i}"}], max_tokens=9, temperature=0.7, top_p=0.9,
                           seed=100 + i, json_schema=schema if i % 2 else None, chat_template_kwargs={"enable_thinking": False})
                for i in range(10)]
        told: list[int] = []
        res = backend.generate(reqs, on_done=told.append)
    finally:
        server.shutdown()
    assert told == [1] * 10  # each request told as it came back (progress bars)
    assert [r.id for r in res] == [f"r{i}" for i in range(10)]
    assert [r.text for r in res] == [f"Q{i}" for i in range(10)]  # paired by position
    assert backend.prompt_tokens == 70 and backend.completion_tokens == 30
    by_q = {b["messages"][-1]["content"]: b for b in seen}
    assert by_q["q3"]["seed"] == 103 and by_q["q3"]["max_tokens"] == 9 and by_q["q3"]["top_p"] == 0.9
    assert by_q["q3"]["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    assert "response_format" not in by_q["q2"]
    assert by_q["q2"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_server_backend_errors_name_the_url():
    # A server that is not there: one error naming the URL, after the client's retries.
    with pytest.raises(EngineError, match=r"the server at http://127\.0\.0\.1:9/v1 did not answer"):
        make_backend("openai", "m", base_url="http://127.0.0.1:9/v1", max_retries=1)
    # A model the server does not serve.
    server, _ = _serve(lambda body: (200, _completion("x")))
    url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        with pytest.raises(EngineError, match="does not serve model 'other' .*serves: m"):
            make_backend("openai", "other", base_url=url)
    finally:
        server.shutdown()
    # 400 for every request (e.g. no JSON-schema support): the wave fails with the way out.
    server, _ = _serve(lambda body: (400, {"error": {"message": "response_format is not supported", "type": "BadRequest"}}))
    url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        backend = make_backend("openai", "m", base_url=url)
        with pytest.raises(EngineError, match="structured_output: none"):
            backend.generate([GenRequest(i, [{"role": "user", "content": "q"}], json_schema={"type": "object"}) for i in "ab"])
        # One request alone is that request's problem: its error result, with the server's reason.
        (res,) = backend.generate([GenRequest("a", [{"role": "user", "content": "q"}], json_schema={"type": "object"})])
        assert res.finish_reason == "error" and "response_format is not supported" in res.error
    finally:
        server.shutdown()
    with pytest.raises(ConfigError, match="--base-url"):
        make_backend("openai", "m")
    with pytest.raises(ConfigError, match="engine settings belong to the server"):
        make_backend("openai", "m", base_url=url, tensor_parallel_size=2)


def test_a_server_gets_each_problems_next_request_without_waiting_for_a_wave(gsm8k_collapsed):
    """Problems run side by side on a server: while one request is slow, the other problems go on to their later
    agents (with waves, nothing of wave 2 could be sent before wave 1's slowest request came back)."""
    import time

    import polars as pl

    from fake_openai_server import FakeServer, ok_chat

    rows = pl.read_parquet(gsm8k_collapsed).sort("problem_id").head(6).to_dicts()
    slow = rows[0]["problem"][:60]
    seen: list[tuple[float, str, bool]] = []

    def chat(body):
        schema = json.dumps(body.get("response_format") or {})
        agent = "attribution" if "keywords" in schema else "judgment" if "score" in schema else "hint"
        mine = any(slow in (m.get("content") or "") for m in body["messages"])
        seen.append((time.monotonic(), agent, mine))
        if mine and agent == "attribution":
            time.sleep(3)
        return ok_chat(body)

    with FakeServer(chat) as server:
        backend = make_backend("openai", "m", base_url=server.url, max_concurrency=8)
        t0 = time.monotonic()
        table = hint_shard(rows, HintConfig(), backend)
        took = time.monotonic() - t0
    slow_sent = next(t for t, agent, mine in seen if mine)
    others_judged = [t for t, agent, mine in seen if agent == "judgment" and not mine]
    assert others_judged and max(others_judged) < slow_sent + 3  # every other problem was judged while the slow one waited
    assert table.num_rows == 6 and set(table.column("status").to_pylist()) == {"accepted"}
    assert took < 3 + 2  # the slow request, plus the slow problem's own later steps: no wave waited on it


# ----------------------------------------------------------------------------- thinking models

# Qwen3's own logic for the generation prompt (its template, shortened to what matters here).
QWEN3_STYLE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def test_thinking_is_off_in_the_template_and_stripped_from_answers(gsm8k_collapsed):
    """The agents' requests turn Qwen3's thinking off, and a <think> block never reaches the parsers."""
    import polars as pl
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # what transformers renders chat templates with

    cfg = HintConfig(llm_judge=False, max_retry=0, max_refine=0)
    assert cfg.template_kwargs("generation") == {"enable_thinking": False}
    render = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(QWEN3_STYLE).render
    msgs = [{"role": "user", "content": "hi"}]
    assert render(messages=msgs, add_generation_prompt=True, **cfg.template_kwargs("attribution")).endswith("<think>\n\n</think>\n\n")
    assert "<think>" not in render(messages=msgs, add_generation_prompt=True)  # left on: the model opens it itself
    thinks = HintConfig(agent_chat_template_kwargs={"judgment": {"enable_thinking": True}})
    assert thinks.template_kwargs("judgment") == {"enable_thinking": True}
    assert thinks.template_kwargs("generation") == {"enable_thinking": False}

    decoy = '{"hint": "The answer is 18.", "keywords": ["decoy"]}'

    def script(req):
        if "keywords" in json.dumps(req.json_schema or {}):
            return f'<think>Let me try {decoy} first.</think>{{"keywords": ["unit rate"], "error": "divides the wrong way"}}'
        return f'<think>Maybe {decoy}? No.</think>\n{{"hint": "Work out the price of one item before scaling up."}}'

    row = pl.read_parquet(gsm8k_collapsed).sort("problem_id").head(1).to_dicts()
    fake = FakeBackend(script)
    table = hint_shard(row, cfg, fake)
    out = table.to_pylist()[0]
    assert all(r.chat_template_kwargs == {"enable_thinking": False} for call in fake.log for r in call)
    assert out["keywords"] == ["unit rate"] and out["hint"] == "Work out the price of one item before scaling up."
    assert out["status"] == "accepted"
    # R1-style output (the template opened the block) and an unclosed block (ran out of tokens while thinking).
    assert hint_agents.GENERATION.parse('still thinking {"hint": "no"} </think>{"hint": "yes"}', cfg)["hint"] == "yes"
    assert hint_agents.GENERATION.parse('<think>{"hint": "half a thought"}', cfg) is None


def test_a_thinking_judge_has_room_to_think(gsm8k_collapsed):
    """docs/gpus.md: `{judgment: {enable_thinking: true}}` lets the judge think. Its thinking comes before the
    verdict, so it needs tokens beyond the verdict's cap and no grammar that forces "{" first."""
    import polars as pl

    cfg = HintConfig(agent_chat_template_kwargs={"judgment": {"enable_thinking": True}}, max_retry=0, max_refine=0,
                     judge_check={"enabled": False})
    assert cfg.thinks("judgment") and not cfg.thinks("generation")
    thinking = "Let me check each step of the hint against the problem. " * 60  # ~900 tokens, as Qwen3 writes

    def script(req):
        props = (req.json_schema or {}).get("properties", {})
        if "keywords" in props:
            return json.dumps({"keywords": ["unit rate"], "error": "divides the wrong way"})
        if "hint" in props:
            return json.dumps({"hint": "Work out the price of one item before scaling up."})
        return f'<think>{thinking}</think>{{"correct": true, "score": 9, "feedback": "Points the way."}}'

    row = pl.read_parquet(gsm8k_collapsed).sort("problem_id").head(1).to_dicts()
    fake = FakeBackend(script)
    out = hint_shard(row, cfg, fake).to_pylist()[0]
    judged = [r for call in fake.log for r in call if ":judgment:" in r.id]
    assert judged and all(r.json_schema is None and r.max_tokens == cfg.max_tokens.judgment + cfg.max_tokens.thinking
                          for r in judged)
    assert all(r.json_schema is not None for call in fake.log for r in call if ":judgment:" not in r.id)
    assert out["status"] == "accepted" and out["judge_score"] == 9


def test_shards_split_over_the_engine_workers():
    """The default shard size would give 432 problems one shard: 1 of 8 engines busy."""
    from mentor.pipeline.executor import LOCAL
    from mentor.stages.hint import shard_size_for

    class Eight:
        def workers(self):
            return 8

    assert shard_size_for(HintConfig(), 432, Eight()) == 54
    assert shard_size_for(HintConfig(), 432, LOCAL) == 512  # this process: one engine
    assert shard_size_for(HintConfig(shard_size=100), 432, Eight()) == 100  # the user's choice stands


def test_a_stage_releases_its_engines_unless_held(gsm8k_collapsed, tmp_path, monkeypatch):
    """hint_to_dir shuts the process's engines (and the executor's workers') when it ends; hold_engines keeps them."""
    from mentor.pipeline import backends, llm
    from mentor.stages.hint import HINT

    closed: list[str] = []

    class Engine:
        def close(self):
            closed.append("engine")

    class Workers:
        def imap(self, fn, items, *args):
            return (fn(item, *args) for item in items)

        def map(self, fn, items, *args):
            return [fn(item, *args) for item in items]

        def workers(self):
            return 1

        def close_engines(self):
            closed.append("workers")

    spec = BackendSpec("fake", options={"script": "mentor.stages.hint.agents:fake_script"})
    cfg = HintConfig(llm_judge=False)
    # An engine this process started and keeps (the engine kind's `make` answers this stand-in, no vLLM starts).
    monkeypatch.setattr(backends.kind(backends.DEFAULT), "make", lambda model, options: Engine())
    engine = llm.make_backend(backends.DEFAULT, "k")
    with llm.hold_engines():
        HINT({"collapsed": [gsm8k_collapsed], "sample": 3}, cfg, tmp_path / "a",
             Context(backend=spec, executor=Workers()))
    assert closed == [] and llm.make_backend(backends.DEFAULT, "k") is engine  # still open: the same engine
    HINT({"collapsed": [gsm8k_collapsed], "sample": 3}, cfg, tmp_path / "b", Context(backend=spec, executor=Workers()))
    assert closed == ["engine", "workers"] and llm.open_engines() == 0
