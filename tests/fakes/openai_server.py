"""A local OpenAI-compatible ``/v1/chat/completions`` endpoint that answers from a script.

Stdlib only: ``http.server`` in a thread on 127.0.0.1 with an ephemeral port. Each request takes
the next scripted answer (a chat-completion message content, a raw body as text or bytes, an HTTP
status, a delay, or a response dripped one byte at a time) and is recorded, body and headers, for
the test to inspect.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    content: str | None = None  # the assistant message content of a 200 chat completion
    status: int = 200
    raw_body: str | bytes | None = None  # sent as is instead of a chat completion
    delay_s: float = 0.0  # sleep before answering (a hang, when longer than the client timeout)
    finish_reason: str = "stop"
    drip_s: float = 0.0  # write the whole response, status line and headers first, one byte
    # every drip_s seconds: each read is quick, the exchange is not


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeOpenAIServer:
    """Context manager; ``url`` is the base URL to configure (``http://127.0.0.1:<port>/v1``)."""

    def __init__(self) -> None:
        self.script: deque[Scripted] = deque()
        self.received: list[Received] = []
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                server.received.append(Received(self.path, dict(self.headers.items()), body))
                if self.path != "/v1/chat/completions":
                    self._send(404, json.dumps({"error": {"message": "not found"}}))
                    return
                answer = server.script.popleft() if server.script else Scripted(
                    status=500, raw_body='{"error": {"message": "no scripted reply left"}}')
                if answer.delay_s and server._stop.wait(answer.delay_s):
                    return  # server closing: drop the connection
                if answer.raw_body is not None:
                    self._send(answer.status, answer.raw_body, drip_s=answer.drip_s)
                    return
                if body.get("stream") and answer.status == 200:
                    self._stream(body, answer)
                    return
                self._send(answer.status, drip_s=answer.drip_s, text=json.dumps({
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "finish_reason": answer.finish_reason,
                                 "message": {"role": "assistant", "content": answer.content}}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                }))

            def _send(self, status: int, text: str | bytes, *, drip_s: float = 0.0) -> None:
                data = text.encode("utf-8") if isinstance(text, str) else text
                if drip_s:
                    self._drip(status, data, drip_s)
                    return
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout): nothing to answer to
                    pass

            def _drip(self, status: int, data: bytes, drip_s: float) -> None:
                head = (f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n").encode("ascii")
                whole = head + data
                try:
                    for i in range(len(whole)):
                        self.wfile.write(whole[i:i + 1])
                        self.wfile.flush()
                        if server._stop.wait(drip_s):
                            return  # server closing
                except OSError:  # the client gave up
                    pass

            def _stream(self, body: dict[str, Any], answer: Scripted) -> None:
                """Server-sent events, as clients that ask for ``stream: true`` expect."""
                base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                        "model": body.get("model", "fake")}
                chunks = [
                    {**base, "choices": [{"index": 0, "delta": {
                        "role": "assistant", "content": answer.content or ""},
                        "finish_reason": None}]},
                    {**base, "choices": [{"index": 0, "delta": {},
                                          "finish_reason": answer.finish_reason}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                               "total_tokens": 2}},
                ]
                data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                raw = data.encode("utf-8")
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def add(self, content: str | None = None, **kw: Any) -> FakeOpenAIServer:
        self.script.append(Scripted(content=content, **kw))
        return self

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
