"""A loopback OpenAI-compatible server for the GSM8K tests, and the GSM8K-format data it answers.

The tests drive the real lm-eval client over real HTTP, so the only fake is the model: this
server recognises which question a request asks (the last `Question: ...` of the prompt or of
the last chat message) and answers it by a per-question script of actions, one per attempt
(the last action repeats):

- `correct`   `... #### A`              strict-match and flexible-extract both right
- `wrong`     `... #### A1`             both wrong (the answer with a digit appended)
- `no_marker` `The total is A.`         strict-match invalid, flexible-extract right
- `http500`   HTTP 500                  lm-eval retries
- `drop`      connection closed with no response
- `hang`      never answers (until the server stops), so the client's timeout fires
- `http500_last` waits until every other question was answered, then HTTP 500: a hard
  failure that is certain to come after all other answers

It counts requests received and answered per question, which is how the tests prove that no
question is asked twice. `hang_after=N` answers exactly N requests and makes every later one
hang, so a client can be killed part-way at a known point with nothing in flight but hung
requests. `crash_after=N` (script mode) prints a known NoPE crash signature and exits after N
answers, like a server whose kernel rejected a call. `models_status=500` makes GET /v1/models
fail with that status: a server that is up but broken.

It also serves `/metrics` with vLLM's finished-request counter (`vllm:request_success_total`,
finish reason `stop`) counting its answers, unless `metrics=False`.

Run as a script (`python tests/fake_openai_server.py --port P --data DIR`) it serves the
dataset in DIR answering every question correctly: the child that launch-mode tests start.
`--say LINE` (repeatable) prints LINE to its output first, e.g. a crafted vLLM log line, and
`--attention-backend NAME` is accepted as vLLM accepts it and printed as received.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

ACTIONS = ("correct", "wrong", "no_marker", "http500", "drop", "hang", "http500_last")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # the text after '#### '


def make_problems(count: int, seed: int, tag: str) -> list[Problem]:
    """`count` distinct addition problems with answers of 2+ digits (no single-digit edge cases)."""
    rng = random.Random(seed)
    problems = []
    for i in range(count):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        problems.append(
            Problem(
                f"{tag} problem {i}: Ann has {a} apples and buys {b} more. "
                "How many apples does she have?",
                str(a + b),
            )
        )
    return problems


def solution(problem: Problem) -> str:
    """The GSM8K `answer` field: a worked solution ending in `#### N`."""
    a, b = (int(word) for word in problem.question.split() if word.isdigit())
    return (
        f"She has {a} + {b} = <<{a}+{b}={problem.answer}>>{problem.answer} apples.\n"
        f"#### {problem.answer}"
    )


def write_jsonl(path: Path, problems: Iterable[Problem]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for p in problems:
            fh.write(json.dumps({"question": p.question, "answer": solution(p)}) + "\n")


def write_dataset(directory: Path, n_test: int, n_train: int = 20, seed: int = 0) -> list[Problem]:
    """train.jsonl and test.jsonl in GSM8K's format; returns the test problems in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    test = make_problems(n_test, seed, "test")
    write_jsonl(directory / "test.jsonl", test)
    write_jsonl(directory / "train.jsonl", make_problems(n_train, seed + 1, "train"))
    return test


def read_dataset(directory: Path) -> list[Problem]:
    """The test problems of a GSM8K-format directory (the real data or a generated one)."""
    problems = []
    for line in (directory / "test.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        problems.append(Problem(row["question"], row["answer"].rsplit("#### ", 1)[1].strip()))
    return problems


def question_of(payload: dict) -> str:
    """The question a completions or chat request asks: its last `Question: ...\\nAnswer:`."""
    text = payload["prompt"] if "prompt" in payload else payload["messages"][-1]["content"]
    return text.rsplit("Question: ", 1)[-1].rsplit("\nAnswer:", 1)[0]


class FakeOpenAIServer:
    """An aiohttp server on 127.0.0.1 in a background thread; use as a context manager."""

    def __init__(
        self,
        problems: Sequence[Problem],
        scripts: dict[str, Sequence[str]] | None = None,
        model: str = "fake-model",
        hang_after: int | None = None,
        crash_after: int | None = None,
        metrics: bool = True,
        models_status: int = 200,
    ) -> None:
        self.answers = {p.question: p.answer for p in problems}
        self.scripts = {q: list(s) for q, s in (scripts or {}).items()}
        for script in self.scripts.values():
            unknown = set(script) - set(ACTIONS)
            assert not unknown, f"unknown actions {unknown}"
        self.model = model
        self.hang_after = hang_after
        self.crash_after = crash_after
        self.metrics = metrics
        self.log_requests = False  # print each request's question (the launched child's log)
        self.models_status = models_status  # anything but 200: GET /v1/models fails with it
        self._reserved = 0  # answers promised so far (decided on receipt, for hang_after)
        self.received: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()
        self.payloads: list[dict] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._stop: asyncio.Event | None = None
        self._progress: asyncio.Condition | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self, port: int = 0) -> FakeOpenAIServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(port), self._loop).result(timeout=30)
        return self

    async def _start(self, port: int) -> None:
        self._stop = asyncio.Event()
        self._progress = asyncio.Condition()
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        if self.metrics:
            app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=30)
            self._runner = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    async def _shutdown(self) -> None:
        self._stop.set()  # hung handlers return now
        await self._runner.cleanup()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ counters
    def set_hang_after(self, value: int | None) -> None:
        with self._lock:
            self.hang_after = value

    def answered_total(self) -> int:
        with self._lock:
            return sum(self.answered.values())

    def snapshot(self) -> tuple[Counter[str], Counter[str]]:
        with self._lock:
            return Counter(self.received), Counter(self.answered)

    # ------------------------------------------------------------------ handlers
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        if self.models_status != 200:
            return web.json_response({"error": "scripted failure"}, status=self.models_status)
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        labels = f'engine="0",model_name="{self.model}"'
        text = "".join(
            f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {float(value)}\n'
            for reason, value in (("stop", self.answered_total()), ("length", 0), ("abort", 0))
        )
        return web.Response(text="# TYPE vllm:request_success_total counter\n" + text)

    async def _hang(self, request: web.Request) -> web.Response:
        await self._stop.wait()
        request.transport and request.transport.close()
        return web.Response(status=503)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        question = question_of(payload)
        if self.log_requests:
            print(f"request for: {question[:60]}", flush=True)
        with self._lock:
            self.payloads.append(payload)
            attempt = self.received[question]
            self.received[question] += 1
            hang = self.hang_after is not None and self._reserved >= self.hang_after
            if not hang:
                self._reserved += 1
        if question not in self.answers:
            return web.json_response({"error": f"unknown question {question!r}"}, status=400)
        if hang:
            return await self._hang(request)
        script = self.scripts.get(question, ["correct"])
        action = script[min(attempt, len(script) - 1)]
        if action == "http500":
            return web.json_response({"error": "scripted failure"}, status=500)
        if action == "http500_last":
            async with self._progress:
                await self._progress.wait_for(lambda: self._others_answered(question))
            return web.json_response({"error": "scripted hard failure"}, status=500)
        if action == "drop":
            request.transport.close()
            return web.Response(status=599)  # never reaches the client
        if action == "hang":
            return await self._hang(request)
        answer = self.answers[question]
        text = {
            "correct": f"Adding the two numbers gives the total.\n#### {answer}",
            "wrong": f"Adding the two numbers gives the total.\n#### {answer}1",
            "no_marker": f"The total is {answer}.",
        }[action]
        with self._lock:
            if self.crash_after is not None and sum(self.answered.values()) >= self.crash_after:
                print(
                    "ValueError: SM120 sparse MLA v32/GLM expects sparse block_tables shape "
                    "(512, 1, 2048), got (512, 1, 2176)",
                    flush=True,
                )
                os._exit(1)
            self.answered[question] += 1
        async with self._progress:
            self._progress.notify_all()
        return web.json_response(self._body(payload, text))

    def _others_answered(self, question: str) -> bool:
        with self._lock:
            return all(self.answered[q] for q in self.answers if q != question)

    def _body(self, payload: dict, text: str) -> dict:
        if "messages" in payload:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
            return {
                "id": "chat-1",
                "object": "chat.completion",
                "model": self.model,
                "choices": [choice],
            }
        choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": self.model,
            "choices": [choice],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--say", action="append", default=[], help="a line to print first")
    parser.add_argument("--attention-backend", default=None)
    args = parser.parse_args()
    for line in args.say:
        print(line, flush=True)
    if args.attention_backend is not None:
        print(f"attention backend argument: {args.attention_backend}", flush=True)
    server = FakeOpenAIServer(
        read_dataset(args.data), model=args.model, crash_after=args.crash_after
    )
    server.log_requests = True
    server.start(args.port)
    print(f"serving {args.model} on {server.base_url}", flush=True)
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main()
