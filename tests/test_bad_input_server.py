"""`mentor hint`, `rollout`, `rescue` with `--backend openai` against a fake server that misbehaves (real GSM8K data).

The server (`fake_openai_server.FakeServer`, a real HTTP server on 127.0.0.1) answers with torn
JSON, HTML, chat completions without choices or messages, model lists that are not lists, errors,
or nothing at all. Whatever it does, the command ends as a one-line error naming the server and
what it did (exit 1, nothing written), or with a correct result: never a traceback, a hang, or
answers it never gave scored as rollouts or turned into fallback hints.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from bad_input_lib import Case, params, run_case
from fake_openai_server import CLOSE, HANG, FakeServer, Reply, completion, hang_after, json_reply, model_list, ok_chat

_SERVERS: list[FakeServer] = []


@pytest.fixture(autouse=True)
def _close_servers():
    yield
    while _SERVERS:
        _SERVERS.pop().close()


def _server(chat=ok_chat, models=None) -> FakeServer:
    s = FakeServer(chat, models)
    _SERVERS.append(s)
    return s


def _collapsed() -> pl.DataFrame:
    from mentor.data import bundled
    from mentor.stages.mine import MineConfig
    from mine_lib import mine

    df, _ = mine([str(bundled("gsm8k_rollouts.parquet"))], MineConfig())
    return df.head(6)


def _gsm8k_problem(i: int) -> str:
    from mentor.data import BUNDLED_SETS, bundled

    return pl.read_parquet(bundled(BUNDLED_SETS["gsm8k"]))["problem"][i]


COLLAPSED = _collapsed()
# Problems whose requests the server refuses (400: longer than its context): one collapsed (hint), one of gsm8k (rollout).
TOO_LONG = (COLLAPSED["problem"][1][:60], _gsm8k_problem(1)[:60])


def _hint(chat=ok_chat, models=None, *extra: str, url: str | None = None):
    def make(root: Path) -> list[str]:
        COLLAPSED.write_parquet(root / "c.parquet")
        base = url or _server(chat, models).url
        return ["hint", str(root / "c.parquet"), "--out", str(root / "out"), "--backend", "openai", "--model", "m",
                "--base-url", base, "--no-progress", *extra]
    return make


def _rollout(chat=ok_chat, models=None, *extra: str, url: str | None = None):
    def make(root: Path) -> list[str]:
        base = url or _server(chat, models).url
        return ["rollout", "gsm8k", "--limit", "3", "--k", "2", "--out", str(root / "out"), "--backend", "openai",
                "--policy", "m", "--base-url", base, "--no-progress", *extra]
    return make


def _rescue(chat=ok_chat, *extra: str):
    def make(root: Path) -> list[str]:
        import pyarrow.parquet as pq

        from mentor.pipeline.backends.fake import FakeBackend
        from mentor.stages.hint.machine import hint_shard
        from mentor.stages.hint.agents import fake_script
        from mentor.stages.hint.config import HintConfig

        COLLAPSED.head(3).write_parquet(root / "c.parquet")
        pq.write_table(hint_shard(COLLAPSED.head(3).to_arrow(), HintConfig(), FakeBackend(fake_script)), root / "h.parquet")
        return ["rescue", "--collapsed", str(root / "c.parquet"), "--hints", str(root / "h.parquet"), "--out", str(root / "out"),
                "--k", "2", "--backend", "openai", "--policy", "m", "--base-url", _server(chat).url, "--no-progress", *extra]
    return make


# --------------------------------------------------------------------------- ways to misbehave

TORN = lambda body: Reply(200, "application/json", b'{"choices": [{"message": {"content": "The ans')  # noqa: E731
HTML = lambda body: Reply(200, "text/html", b"<html><body>502 Bad Gateway</body></html>")  # noqa: E731
NO_MESSAGE = lambda body: json_reply({"choices": [{"index": 0, "finish_reason": "stop"}]})  # noqa: E731
NO_CHOICES = lambda body: json_reply({"id": "x", "object": "chat.completion", "choices": []})  # noqa: E731
CHOICES_TEXT = lambda body: json_reply({"choices": "The answer is 4."})  # noqa: E731
A_LIST = lambda body: json_reply([completion("x")])  # noqa: E731
CONTENT_NUMBER = lambda body: json_reply(completion(42))  # noqa: E731
NOT_UTF8 = lambda body: Reply(200, "application/json", b'{"choices": [{"message": {"content": "\xff\xfe"}}]}')  # noqa: E731
ERROR_500 = lambda body: json_reply({"error": {"message": "CUDA out of memory"}}, 500)  # noqa: E731
REFUSE_ALL = lambda body: json_reply({"error": {"message": "response_format is not supported"}}, 400)  # noqa: E731


def bad_usage(body: dict) -> Reply:
    return json_reply(json.loads(ok_chat(body).body) | {"usage": "lots"})


def odd_finish(body: dict) -> Reply:
    obj = json.loads(ok_chat(body).body)
    obj["choices"][0]["finish_reason"] = "content_filter"
    return json_reply(obj)


def reasoning_only(body: dict) -> Reply:
    """A thinking model cut at max_tokens: everything went to reasoning_content, content is null."""
    return json_reply(completion(None, finish="length"))


def too_long_for_one(body: dict) -> Reply:
    if any(t in (m.get("content") or "") for m in body["messages"] for t in TOO_LONG):
        return json_reply({"error": {"message": "This model's maximum context length is 512 tokens. However, you requested 900"}}, 400)
    return ok_chat(body)


def models(reply) -> callable:
    return lambda: reply


def hint_answered_despite(root: Path, res) -> None:
    stats = json.loads((root / "out" / "stats.json").read_text())
    assert stats["failed_calls"] > 0 and stats["problems"] == 6, stats
    hints = pl.read_parquet(root / "out" / "hints.parquet")
    assert hints.filter(pl.col("status") != "fallback").height >= 5  # the other problems were hinted by the model


def nothing_written(root: Path, res) -> None:
    out = root / "out"
    assert not list(out.glob("*.parquet")) and not (out / "hints.parquet").exists(), sorted(p.name for p in out.iterdir())


def rollouts_truncated(root: Path, res) -> None:
    stats = json.loads(res.output.strip().splitlines()[-1])
    assert stats["rollouts"] == 6 and stats["truncated"] == 6, stats


def rollout_ok(root: Path, res) -> None:
    stats = json.loads(res.output.strip().splitlines()[-1])
    assert stats["rollouts"] == 6 and stats["completion_tokens"] == 0, stats  # usage unreadable: 0, not a crash


NO_ANSWER = r"^Error: .*the server at http://127\.0\.0\.1:\d+/v1 gave no usable answer"
HUNG = (r"^Error: .*the server at http://127\.0\.0\.1:\d+/v1 accepted requests and answered nothing for \d s "
        r"\(--request-timeout 3\); \d+ request\(s\) pending: ")


def server_cases() -> list[Case]:
    cases = [
        Case("server-hint-ok", "handled", _hint(), 0),
        Case("server-rollout-ok", "handled", _rollout(), 0),
        Case("server-rescue-ok", "handled", _rescue(), 0),
        Case("server-hint-usage-not-a-mapping", "handled", _hint(bad_usage), 0),
        Case("server-rollout-usage-not-a-mapping", "handled", _rollout(bad_usage), 0, check=rollout_ok),
        Case("server-hint-odd-finish-reason", "handled", _hint(odd_finish), 0),
        Case("server-rollout-reasoning-only-truncated", "handled", _rollout(reasoning_only), 0, check=rollouts_truncated),
        # One problem's requests refused: that problem's failed model calls, counted; the others hinted.
        Case("server-hint-one-problem-refused", "handled", _hint(too_long_for_one), 0, check=hint_answered_despite),
        # A rollout that got no response is never written as a failed rollout.
        Case("server-rollout-one-prompt-refused", "error", _rollout(too_long_for_one), 1,
             r"^Error: rollout: .*2 of 6 rollouts got no response from the model \(e\.g\. problem .*maximum context length",
             check=nothing_written),
    ]
    for name, chat, why in [("torn-json", TORN, r"not JSON"), ("html", HTML, r"not JSON: 200 text/html"),
                            ("no-message", NO_MESSAGE, r"no 'message'"), ("choices-empty", NO_CHOICES, r"no choices"),
                            ("choices-not-a-list", CHOICES_TEXT, r"no 'choices' list"), ("body-a-list", A_LIST, r"no 'choices' list"),
                            ("content-a-number", CONTENT_NUMBER, r"not text \(int\)"), ("not-utf8", NOT_UTF8, r"not JSON"),
                            ("all-refused", REFUSE_ALL, r"response_format is not supported.*structured_output: none")]:
        cases.append(Case(f"server-hint-{name}", "error", _hint(chat), 1, NO_ANSWER + ".*" + why, check=nothing_written))
        # (a rollout asks for no JSON schema: no word about structured output)
        cases.append(Case(f"server-rollout-{name}", "error", _rollout(chat), 1, NO_ANSWER + ".*" + why.split(".*")[0],
                          check=nothing_written))
    cases += [
        Case("server-rescue-choices-empty", "error", _rescue(NO_CHOICES), 1, NO_ANSWER + r".*no choices", check=nothing_written),
        # Errors the client retries (4 times, with backoff), then the server's reason.
        Case("server-rollout-500", "error", _rollout(ERROR_500), 1, NO_ANSWER + r".*CUDA out of memory", max_seconds=40),
        Case("server-hint-hangs-up", "error", _hint(lambda b: CLOSE), 1, NO_ANSWER + r".*APIConnectionError", max_seconds=40),
        # A server that accepts and never answers: the stage fails within one --request-timeout of silence (not
        # that times every retry), naming the URL and what was pending (its age: 3 s, or 4 s on a loaded machine
        # that reports a second late).
        Case("server-hint-never-answers", "error", _hint(lambda b: HANG, None, "--request-timeout", "3"), 1,
             HUNG + r"\d+:\w+:\d+ \([34] s\)", max_seconds=8),
        Case("server-rollout-never-answers", "error", _rollout(lambda b: HANG, None, "--request-timeout", "3"), 1,
             HUNG + r"\S+ \([34] s\)", max_seconds=8),
        # ... and one that answers for a while, then stalls.
        Case("server-hint-stalls", "error", _hint(hang_after(4), None, "--request-timeout", "3"), 1, HUNG,
             max_seconds=8, check=nothing_written),
        Case("server-models-never-answers", "error", _hint(ok_chat, models(HANG), "--request-timeout", "1"), 1,
             r"did not answer GET /models \(APITimeoutError", max_seconds=30),
        # GET /models: not an OpenAI model list, or not this model.
        Case("server-models-html", "error", _hint(ok_chat, models(Reply(200, "text/html", b"<html>dashboard</html>"))), 1,
             r"answered GET /models with 200 text/html '<html>dashboard</html>', not an OpenAI model list"),
        Case("server-models-data-a-string", "error", _rollout(ok_chat, models(json_reply({"data": "m"}))), 1,
             r"answered GET /models with 200 application/json .*not an OpenAI model list"),
        Case("server-models-entry-without-id", "error", _hint(ok_chat, models(json_reply({"data": [{"name": "m"}]}))), 1,
             r"not an OpenAI model list"),
        Case("server-models-torn", "error", _hint(ok_chat, models(Reply(200, "application/json", b'{"data": ['))), 1,
             r"not an OpenAI model list"),
        Case("server-models-other-model", "error", _hint(ok_chat, models(json_reply(model_list("other")))), 1,
             r"does not serve model 'm' \(it serves: other\)"),
        Case("server-models-404", "error", _hint(ok_chat, models(json_reply({"error": {"message": "no"}}, 404))), 1,
             r"answered GET /models with NotFoundError.*ends in /v1"),
        Case("server-models-401", "error", _hint(ok_chat, models(json_reply({"error": {"message": "bad key"}}, 401))), 1,
             r"refused the API key"),
        Case("server-nothing-listens", "error", _rollout(url="http://127.0.0.1:9/v1"), 1, r"did not answer GET /models",
             max_seconds=30),
    ]
    for name, url in [("no-scheme", "127.0.0.1:8000/v1"), ("port-out-of-range", "http://127.0.0.1:99999/v1"),
                      ("space", "http://exa mple/v1"), ("ftp", "ftp://127.0.0.1/v1"), ("no-host", "http:///v1"),
                      ("bracket", "http://[::1/v1"), ("query", "http://127.0.0.1:8000/v1?x=1")]:
        cases.append(Case(f"server-base-url-{name}", "error", _hint(url=url), 2, r"^Error: .*--base-url"))
        cases.append(Case(f"server-rollout-base-url-{name}", "error", _rollout(url=url), 2, r"^Error: .*--base-url"))
    for v in ("0", "-1", "nan", "inf"):
        cases.append(Case(f"server-request-timeout-{v}", "error", _hint(ok_chat, None, "--request-timeout", v), 2,
                          r"Invalid value for '--request-timeout'"))
    return cases


SERVER = server_cases()


@pytest.mark.parametrize("case", params(SERVER))
def test_server_bad_input(case: Case, tmp_path):
    run_case(case, tmp_path / "case")


def test_a_busy_server_fails_one_request_and_a_long_wait_says_so(monkeypatch, caplog):
    """A request the server never answers while it answers others: that request alone fails, after one timeout
    (no retry); a wait past NOTICE_AFTER says, when it starts to be long, how long it may last."""
    import time

    from mentor.pipeline.backends.openai import client as openai_backend
    from mentor.pipeline.llm import GenRequest

    monkeypatch.setattr(openai_backend, "NOTICE_AFTER", 0.6)

    def chat(body):
        if "never" in body["messages"][0]["content"]:
            return HANG
        time.sleep(1.5)  # busy: answers late in the other request's wait
        return ok_chat(body)

    backend = openai_backend.OpenAIBackend("m", _server(chat).url, timeout=2.0)
    reqs = [GenRequest(id="a", messages=[{"role": "user", "content": "never mind"}]),
            GenRequest(id="b", messages=[{"role": "user", "content": "2 + 2?"}])]
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="mentor.pipeline.backends.openai.client"):
        out = backend.generate(reqs)
    took = time.monotonic() - started
    assert out[1].finish_reason == "stop" and out[0].finish_reason == "error"
    assert "no answer within 2 s, while the server answered other requests" in out[0].error
    assert took < 3.5, took  # one timeout, not one per retry (max_retries 4)
    notice = [r.getMessage() for r in caplog.records if f"{backend.base_url} has not answered for" in r.getMessage()]
    assert notice and "waits up to 2 s (--request-timeout)" in notice[0] and "request(s) pending: a" in notice[0]
    backend.close()
