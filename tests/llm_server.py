"""A small OpenAI-compatible chat-completions server, run by the tests as a separate process:
`python -m tests.llm_server --port N --mode ok|5xx|slow|badjson`.

`POST /v1/chat/completions` answers like OpenAI: in `ok` mode, one fact per line of the
conversation (the text after "speaker: "), as `{"facts": [...]}`; `5xx` answers 500; `slow`
waits 30 s before answering; `badjson` answers a completion whose content is not JSON.
A profile request (`policy.profiles`' prompt) is answered with a profile the schema
validates (`profile_of`). `GET /_received` lists the request bodies received so far (the tests
check that the LLM never saw personal data); `POST /_mode` with `{"mode": ...}` switches the mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("ok", "5xx", "slow", "badjson")


class State:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.received: list[Any] = []
        self.lock = threading.Lock()


def facts_of(messages: list[dict[str, Any]]) -> list[str]:
    user = next((m["content"] for m in messages if m.get("role") == "user"), "")
    lines = str(user).split("\n")[1:]  # after "Conversation:"
    return [line.split(": ", 1)[-1].strip() for line in lines if line.strip()]


PROFILE_EMAIL = "profile.bot@example.com"  # in every profile: memgate must mask it


def profile_of(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A profile request's answer (None: not one): every string property of the schema the
    facts joined (and an e-mail address), every array property the facts."""
    system = str(next((m["content"] for m in messages if m.get("role") == "system"), ""))
    if not system.startswith("You build a user's profile"):
        return None
    schema = json.loads(system.split("JSON Schema:\n", 1)[1].split("\n", 1)[0])
    user = str(next((m["content"] for m in messages if m.get("role") == "user"), ""))
    facts = [line[2:] for line in user.split("\n") if line.startswith("- ")]
    profile: dict[str, Any] = {}
    for name, spec in schema.get("properties", {}).items():
        if spec.get("type") == "array":
            profile[name] = facts
        elif spec.get("type") == "string":
            profile[name] = "; ".join(facts) + f" (written by {PROFILE_EMAIL})"
    return profile


def completion(model: str, content: str) -> dict[str, Any]:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self) -> None:
            if self.path == "/_received":
                with state.lock:
                    self._send(200, list(state.received))
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self._body()
            if self.path == "/_mode":
                state.mode = body["mode"]
                self._send(200, {"mode": state.mode})
                return
            if not self.path.endswith("/chat/completions"):
                self._send(404, {"error": "not found"})
                return
            with state.lock:
                state.received.append(body)
            mode = state.mode
            if mode == "5xx":
                self._send(500, {"error": {"message": "the model is overloaded"}})
            elif mode == "slow":
                time.sleep(30)
                self._send(200, completion(body.get("model", ""), '{"facts": []}'))
            elif mode == "badjson":
                self._send(200, completion(body.get("model", ""), "Sure! Here are the facts:"))
            elif (profile := profile_of(body.get("messages", []))) is not None:
                self._send(200, completion(body.get("model", ""), json.dumps(profile)))
            else:
                facts = facts_of(body.get("messages", []))
                self._send(200, completion(body.get("model", ""),
                                           json.dumps({"facts": facts})))

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", choices=MODES, default="ok")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(State(args.mode)))
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
