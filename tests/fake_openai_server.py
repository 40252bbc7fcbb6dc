"""A fake OpenAI-compatible server on 127.0.0.1 that misbehaves on demand (tests of the `openai` backend).

``FakeServer(chat=..., models=..., text=...)`` answers ``GET /v1/models``, ``POST /v1/chat/completions``
and ``POST /v1/completions`` (text prompts) from three functions; each returns a `Reply` (status, content type, body bytes), or `HANG`
(accept the request and never answer) or `CLOSE` (drop the connection without a word);
`hang_after(n)` answers n chat requests and then hangs on every one (a server that stalls mid-run).
The helpers build the usual answers: `completion` (a well-formed chat completion),
`hint_agent_answer` (what mentor's fake hint model writes, so the hint stage can run end
to end), `model_list`. The server runs in daemon threads; `close()` (or the ``with``
block's end) stops it and releases the handlers that hang.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes


HANG = "hang"
CLOSE = "close"

Answer = Callable[[dict], "Reply | str"]


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status, "application/json", json.dumps(obj).encode())


def completion(text: str | None, finish: str = "stop", usage: Any = None) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": usage if usage is not None else {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def model_list(*names: str, max_model_len: int | None = None) -> dict:
    extra = {} if max_model_len is None else {"max_model_len": max_model_len}  # what vLLM reports
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "t", **extra} for n in names]}


def text_completion(text: str, finish: str = "stop") -> dict:
    return {"id": "x", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def ok_text(body: dict) -> Reply:
    return json_reply(text_completion("The answer is \\boxed{1}."))


def hint_agent_answer(body: dict) -> str:
    """The text mentor's fake hint model gives the request `body` (the schema says which agent asks)."""
    from mentor.pipeline.llm import GenRequest
    from mentor.stages.hint.agents import fake_script

    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    return fake_script(GenRequest("x", body["messages"], json_schema=schema))


def ok_chat(body: dict) -> Reply:
    """A well-behaved server: the hint agents' answers for schema requests, else a short plain answer."""
    text = hint_agent_answer(body) if body.get("response_format") else "The answer is \\boxed{1}."
    return json_reply(completion(text))


def hang_after(n: int, chat: Answer = ok_chat) -> Answer:
    """Answer the first `n` chat requests with `chat`, then accept every request and never answer."""
    lock, seen = threading.Lock(), [0]

    def answer(body: dict) -> "Reply | str":
        with lock:
            seen[0] += 1
            first = seen[0] <= n
        return chat(body) if first else HANG

    return answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):  # a client that hung up mid-answer: nothing to report
        pass


class FakeServer:
    """The fake server; `url` is its ``http://127.0.0.1:PORT/v1``; `seen` the chat bodies it received."""

    def __init__(self, chat: Answer = ok_chat, models: Callable[[], "Reply | str"] | None = None,
                 names: tuple[str, ...] = ("m",), text: Answer = ok_text) -> None:
        self.chat, self.names, self.text = chat, names, text
        self.paths: list[str] = []  # the path of each POST, in order (beside `seen`)
        self.models = models or (lambda: json_reply(model_list(*self.names)))
        self.seen: list[dict] = []
        self.gets = 0
        self.stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _answer(self, reply: "Reply | str") -> None:
                if reply == HANG:
                    owner.stop.wait()
                    self.close_connection = True
                    return
                if reply == CLOSE:
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def do_GET(self):
                owner.gets += 1
                if self.path.rstrip("/").endswith("/models"):
                    self._answer(owner.models())
                else:
                    self._answer(json_reply({"error": {"message": "not found"}}, 404))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                owner.seen.append(body)
                owner.paths.append(self.path)
                chat = self.path.rstrip("/").endswith("/chat/completions")
                self._answer(owner.chat(body) if chat else owner.text(body))

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SilentPort:
    """A TCP port that accepts connections and never says a word (not an HTTP server, not a dask scheduler)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()

    def __enter__(self) -> "SilentPort":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
