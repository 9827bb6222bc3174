"""GSM8K through lm-eval, in process, with a progress display and per-answer persistence.

How lm-eval 0.4.13 keeps answers (read from its source, checked by the tests): with
`use_cache=PREFIX` it wraps the model in `CachingLM`, a `SqliteDict(PREFIX_rank0.db,
autocommit=True)` keyed by a hash of (prompt, generation kwargs), and gives the model a
`CacheHook`. The API model calls `cache_hook.add_partial` as each request succeeds, and with
autocommit that write is a blocking sqlite commit, so every finished generation is on disk
before the next line runs: a run that fails or is killed keeps all its finished answers, and a
run over the same file asks only the missing ones. (CachingLM's own store-and-commit happens
only after all requests succeed, and never when one fails.)

We hook the same two points: the model's `set_cache_hook`, to count committed answers for the
progress bar, and `generate_until`, which CachingLM calls with only the uncached requests, to
learn how many came from the cache. A request that fails after `max_retries` attempts aborts
lm-eval's whole run; that becomes `EvaluationFailed` with one line naming the cause.

lm-eval alone would neither stop a stalled server nor a failing one early: all requests are
queued at once behind one semaphore, so a request's retry waits for every other request's
attempt first. Against a server that never answers, that is about (problems / concurrency) x
timeout_s per attempt (hours at the shipped 1800 s); against one that answers every request
with HTTP 500, nearly two attempts per problem before the first request gives up. A `Guard`
watches the requests instead (`_TrackedModel`): no answer for `stall_timeout_s`, or
`max_consecutive_failures` failed attempts without an answer between them, stops the run at
once, every request cancelled, the answers so far kept.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nopebench.gsm8k.config import Gsm8kConfig
from nopebench.gsm8k.progress import Tracker

CACHE_PREFIX = "requests"  # lm-eval appends "_rank0.db"
CACHE_FILE = f"{CACHE_PREFIX}_rank0.db"


class EvaluationFailed(Exception):
    """lm-eval stopped before the end (its finished answers are in the request cache)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StoppedEarly(Exception):
    """The guard stopped the requests (a stall, or a run of failures); the message says which."""


class Guard:
    """Watches the requests of one evaluation and stops them when the server has stalled (no
    answer completed for `stall_timeout_s`) or keeps failing (`max_consecutive_failures`
    failed attempts with no answer between them). Lives in lm-eval's event loop."""

    def __init__(self, stall_timeout_s: float, max_failures: int) -> None:
        self.stall_timeout_s = stall_timeout_s
        self.max_failures = max_failures
        self.failures = 0  # failed attempts since the last answer
        self.last_error = ""
        self.last_answer = time.monotonic()
        self.reason: str | None = None
        self._stop: asyncio.Event | None = None

    def answered(self) -> None:
        self.failures = 0
        self.last_answer = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = _short_error(exc)
        if self.failures >= self.max_failures:
            self.stop(
                f"{self.failures} requests failed in a row "
                f"(max_consecutive_failures = {self.max_failures}), the last with {self.last_error}"
            )

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self._stop is not None:
            self._stop.set()

    async def _watch_stall(self) -> None:
        while True:
            idle = time.monotonic() - self.last_answer
            if idle >= self.stall_timeout_s:
                self.stop(
                    f"no answer completed for {self.stall_timeout_s:g} s (stall_timeout_s)"
                    + (
                        f"; the last failed request had {self.last_error}"
                        if self.last_error
                        else ""
                    )
                )
                return
            await asyncio.sleep(min(1.0, self.stall_timeout_s - idle))

    async def run(self, requests: Any) -> Any:
        """Await lm-eval's batch of requests unless the guard stops first; then cancel them."""
        self._stop = asyncio.Event()
        self.last_answer = time.monotonic()
        work = asyncio.ensure_future(requests)
        stopped = asyncio.ensure_future(self._stop.wait())
        watch = asyncio.ensure_future(self._watch_stall())
        try:
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            stopped.cancel()
        if work.done():
            return work.result()
        work.cancel()  # its gather's tasks are cancelled with it (and by asyncio.run after)
        await asyncio.gather(work, return_exceptions=True)
        raise StoppedEarly(self.reason)


class _GuardedSemaphore:
    """lm-eval's request semaphore, refusing a slot once the guard has stopped: a request
    that was waiting for a slot is then never sent."""

    def __init__(self, inner: asyncio.Semaphore, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    async def acquire(self) -> bool:
        await self._inner.acquire()
        if self._guard.reason is not None:
            self._inner.release()
            raise StoppedEarly(self._guard.reason)
        return True

    def release(self) -> None:
        self._inner.release()


def _short_error(exc: BaseException) -> str:
    import aiohttp

    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status} {exc.message}".strip()
    if isinstance(exc, TimeoutError):
        return "no answer within timeout_s"
    text = str(exc).strip().splitlines()
    return exc.__class__.__name__ + (f": {text[0]}" if text else "")


@dataclass
class Outcome:
    results: dict[str, Any]
    wall_s: float
    asked: int  # generations requested from the server in this run
    from_cache: int  # answers reused from the request cache (a resumed run)
    retries: int
    attention_backend: dict[str, Any] | None = None  # what the server log showed (backend.py)
    server_requests: dict[str, Any] | None = None  # the server's own count (server.py)


class _CountingHook:
    """lm-eval's CacheHook (which commits each answer), plus a count for the progress bar."""

    def __init__(self, inner: Any, tracker: Tracker) -> None:
        self.inner = inner
        self.tracker = tracker

    def add_partial(self, attr: str, req: Any, res: Any) -> None:
        self.inner.add_partial(attr, req, res)
        if attr == "generate_until":
            self.tracker.answer()


class _TrackedModel:
    """Mixed in front of lm-eval's API model class (see `build_model`): counts answers for the
    progress display and puts every batch of requests under the `Guard`."""

    def __init__(self, *args: Any, tracker: Tracker, guard: Guard, **kwargs: Any) -> None:
        self._tracker = tracker
        self._guard = guard
        super().__init__(*args, **kwargs)

    async def amodel_call(self, *args: Any, **kwargs: Any) -> Any:
        if "sem" in kwargs:  # lm-eval passes it by name: no request is sent once stopped
            kwargs["sem"] = _GuardedSemaphore(kwargs["sem"], self._guard)
        try:
            result = await super().amodel_call(*args, **kwargs)
        except (asyncio.CancelledError, StoppedEarly):
            raise
        except Exception as exc:
            self._guard.failed(exc)
            raise
        self._guard.answered()
        return result

    async def get_batched_requests(self, *args: Any, **kwargs: Any) -> Any:
        return await self._guard.run(super().get_batched_requests(*args, **kwargs))

    def set_cache_hook(self, cache_hook: Any) -> None:
        super().set_cache_hook(_CountingHook(cache_hook, self._tracker))

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        self._tracker.begin(len(requests))  # CachingLM passes only the uncached ones
        return super().generate_until(requests, disable_tqdm)


def model_args(cfg: Gsm8kConfig) -> dict[str, Any]:
    """lm-eval model arguments: no tokenizer (nothing fetched from the hub), text prompts."""
    return {
        "base_url": cfg.endpoint(),
        "model": cfg.model,
        "num_concurrent": cfg.num_concurrent,
        "max_retries": cfg.max_retries,
        "timeout": cfg.timeout_s,
        "max_gen_toks": cfg.max_gen_toks,
        "seed": cfg.seed,
        "tokenizer_backend": None,
        "tokenized_requests": False,
    }


def build_model(cfg: Gsm8kConfig, tracker: Tracker, guard: Guard | None = None) -> Any:
    from lm_eval.api.registry import get_model

    base = get_model(cfg.lm_eval_model)
    cls = type(f"Tracked{base.__name__}", (_TrackedModel, base), {})
    guard = guard or Guard(cfg.stall_timeout_s, cfg.max_consecutive_failures)
    return cls(tracker=tracker, guard=guard, **model_args(cfg))


class _RetryCounter(logging.Handler):
    """lm-eval logs 'Retry attempt N' (tenacity's before_sleep) once per retry."""

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(logging.INFO)
        self.tracker = tracker

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retry attempt"):
            self.tracker.retry()


@contextmanager
def lm_eval_logs(path: Path, tracker: Tracker) -> Iterator[None]:
    """lm-eval's log (retries, server errors) to a file in the run directory, not the terminal.

    asyncio's log goes there too: when one request fails for good, lm-eval abandons the other
    request tasks, and asyncio reports each one's exception ("Task exception was never
    retrieved") when it is garbage collected; that is log material, not terminal output.
    """
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    routes = {"lm_eval": [file_handler, _RetryCounter(tracker)], "asyncio": [file_handler]}
    saved = {}
    for name, handlers in routes.items():
        logger = logging.getLogger(name)
        saved[name] = (logger.level, logger.propagate)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        for h in handlers:
            logger.addHandler(h)
    try:
        yield
    finally:
        for name, handlers in routes.items():
            logger = logging.getLogger(name)
            for h in handlers:
                logger.removeHandler(h)
            logger.setLevel(saved[name][0])
            logger.propagate = saved[name][1]
        file_handler.close()


def describe_failure(exc: BaseException, cfg: Gsm8kConfig) -> str:
    """One line for why lm-eval stopped: the last attempt's error, after its retries."""
    import aiohttp

    if isinstance(exc, StoppedEarly):
        return str(exc)
    attempts = f"after {cfg.max_retries} attempt{'s' if cfg.max_retries > 1 else ''}"
    if isinstance(exc, aiohttp.ClientResponseError):
        return (
            f"a request failed {attempts}: HTTP {exc.status} {exc.message} "
            f"from {exc.request_info.real_url}"
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"a request failed {attempts}: cannot connect to {cfg.endpoint()} ({exc.os_error})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"a request failed {attempts}: the server closed the connection without answering"
    if isinstance(exc, TimeoutError):
        return f"a request failed {attempts}: no answer within timeout_s = {cfg.timeout_s} s"
    text = str(exc).strip().splitlines()
    return f"lm-eval stopped: {exc.__class__.__name__}" + (f": {text[0]}" if text else "")


def run_lm_eval(cfg: Gsm8kConfig, task: Any, manager: Any, total: int, run_dir: Path) -> Outcome:
    """Evaluate `task` (already loaded) against the server; raises EvaluationFailed."""
    import lm_eval

    tracker = Tracker(total)
    lm = build_model(cfg, tracker)
    start = time.perf_counter()
    failure: str | None = None
    with lm_eval_logs(run_dir / "lm_eval.log", tracker), tracker.display():
        try:
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=[task],
                task_manager=manager,
                num_fewshot=cfg.num_fewshot,
                gen_kwargs={"max_gen_toks": cfg.max_gen_toks},
                limit=cfg.limit,
                use_cache=str(run_dir / CACHE_PREFIX),
                log_samples=True,
                apply_chat_template=cfg.api == "chat",
                fewshot_random_seed=cfg.seed,
            )
        except Exception as exc:  # noqa: BLE001 - any abort keeps the cache; the reason is one line
            logging.getLogger("lm_eval").exception("evaluation aborted")
            failure = describe_failure(exc, cfg)
        if failure is not None:
            # The exception (and its traceback, which holds the abandoned tasks) is gone here;
            # collect them now, while asyncio's complaints still go to the log file.
            gc.collect()
    if failure is not None:
        raise EvaluationFailed(failure)
    return Outcome(
        results, time.perf_counter() - start, tracker.asked, tracker.from_cache, tracker.retries
    )
