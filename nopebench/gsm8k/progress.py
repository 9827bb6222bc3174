"""What the terminal shows while lm-eval runs: our progress bar, and none of the libraries' own.

The counts come from lm-eval itself (see `evaluate`): each committed answer, the number of
requests not found in the cache, and each retry it logs. The bar is drawn only on a terminal;
elsewhere (a log, CI) the same counts are a line on stderr every 30 s (console.LineProgress).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import Progress

from nopebench import console as out


@contextmanager
def quiet_third_party_progress() -> Iterator[bool]:
    """Turn off lm-eval's and datasets' tqdm bars, which would garble ours on the same stderr.

    tqdm reads TQDM_* when it is first imported, so this must start before lm-eval is imported
    (the CLI imports it lazily, after this). Yields True when the variable was added here, so a
    launched server's environment can leave it out; it is removed again at the end.
    """
    if "TQDM_DISABLE" in os.environ:
        yield False
        return
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield True
    finally:
        os.environ.pop("TQDM_DISABLE", None)


class Tracker:
    """Counts for the progress bar; fed by lm-eval's cache hook and its log records."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.asked = 0
        self.answered = 0
        self.retries = 0
        self.begun = False  # lm-eval called the model (not everything came from the cache)
        self._progress: Progress | None = None
        self._task = None

    @property
    def from_cache(self) -> int:
        return self.total - self.asked

    @property
    def finished(self) -> int:
        return self.from_cache + self.answered if self.begun else self.answered

    def begin(self, uncached: int) -> None:
        self.begun = True
        self.asked = uncached
        self._refresh()

    def answer(self) -> None:
        self.answered += 1
        self._refresh()

    def retry(self) -> None:
        self.retries += 1
        self._refresh()

    def _refresh(self) -> None:
        if self._progress is None:
            return
        note = f" ({self.from_cache} from cache)" if self.begun and self.from_cache else ""
        retries = f", {self.retries} retries" if self.retries else ""
        self._progress.update(
            self._task, completed=self.finished, description=f"GSM8K answers{note}{retries}"
        )

    @contextmanager
    def display(self) -> Iterator[None]:
        with out.new_progress() as progress:
            self._progress = progress
            self._task = progress.add_task("GSM8K: building prompts", total=self.total)
            try:
                yield
            finally:
                self._progress = None
