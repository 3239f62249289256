"""A real HTTP server on 127.0.0.1 speaking chat completions, replying from a script.

Each step is a reply: `call(name, args)` (one or more tool calls), `text(...)`, `refusal(...)`,
`status(500)` or `sleep(seconds)` (answers too late). `leftover()` lists unused steps, so a
test fails when the policy stopped early.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def call(*calls) -> dict:
    """Tool calls: each a (name, arguments) pair; arguments as dict or raw text."""
    if calls and isinstance(calls[0], str):
        calls = (calls,)
    tool_calls = [{"id": f"call_{i}_{name}", "type": "function",
                   "function": {"name": name,
                                "arguments": args if isinstance(args, str) else json.dumps(args)}}
                  for i, (name, args) in enumerate(calls)]
    return {"message": {"role": "assistant", "content": None, "tool_calls": tool_calls},
            "finish_reason": "tool_calls"}


def text(content: str) -> dict:
    return {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}


def refusal(reason: str) -> dict:
    return {"message": {"role": "assistant", "content": None, "refusal": reason},
            "finish_reason": "stop"}


def status(code: int, headers: dict | None = None) -> dict:
    return {"status": code, "headers": headers or {}}


def sleep(seconds: float) -> dict:
    return {"sleep": seconds}


class ScriptedServer:
    def __init__(self, steps: list[dict]):
        self.steps = list(steps)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    step = server.steps.pop(0) if server.steps else status(599)
                if "sleep" in step:
                    time.sleep(step["sleep"])
                    return self._send(500, {"error": {"message": "too late"}})
                if "status" in step:
                    return self._send(step["status"], {"error": {"message": f"scripted {step['status']}"}},
                                      step["headers"])
                n = len(server.requests)
                reply = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0,
                         "model": body.get("model", "m"),
                         "choices": [{"index": 0, **step}],
                         "usage": {"prompt_tokens": 100 * n, "completion_tokens": 10,
                                   "total_tokens": 100 * n + 10}}
                self._send(200, reply)

            def _send(self, code, payload, headers=None):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def leftover(self) -> list[dict]:
        return list(self.steps)

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
