"""Progress reporting: a rich bar on a terminal, plain lines otherwise, or nothing."""

from __future__ import annotations

import sys
import threading
import time


class Progress:
    """``mode``: "auto" (rich on a terminal, else lines), "rich", "lines" (one line every
    ``every`` seconds and one at the end) or "none"."""

    def __init__(self, total: int, mode: str = "auto", stream=None, every: float = 10.0,
                 label: str = "converting"):
        self.every = every
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "rich" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        self.mode = mode
        self.start = time.monotonic()
        self.last_line = 0.0
        self.desc = ""
        self._open: list[str] = []  # what is being written now, oldest first
        self._lock = threading.Lock()  # shards finish on another thread
        self._bar = None
        self._closed = False
        if mode == "rich":
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress as RichProgress,
                                       TextColumn, TimeRemainingColumn, TransferSpeedColumn)

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                     TransferSpeedColumn(), TimeRemainingColumn(),
                                     console=Console(file=self.stream), transient=False)
            self._task = self._bar.add_task(label, total=self.total)
            self._bar.start()

    def describe(self, text: str) -> None:
        self.desc = text
        if self._bar is not None:
            self._bar.update(self._task, description=text)

    def started(self, name: str) -> None:
        """``name`` is being written (shown as "now writing" until ``finished``)."""
        with self._lock:
            self._open.append(name)
            self.describe(", ".join(self._open))

    def finished(self, name: str) -> None:
        """``name`` is complete: a line says so, and it is no longer "now writing"."""
        with self._lock:
            if name in self._open:
                self._open.remove(name)
            self.describe(", ".join(self._open))
        if self.mode == "lines":
            self.line(f"finished {name}")

    def advance(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, advance=n)
        elif self.mode == "lines" and time.monotonic() - self.last_line > self.every:
            self.line()

    def line(self, text: str | None = None) -> None:
        if self.mode == "none":
            return
        if text is None:
            el = max(time.monotonic() - self.start, 1e-9)
            text = (f"{100 * self.done / self.total:.0f}% done: {self.done / 1e9:.2f} of "
                    f"{self.total / 1e9:.2f} GB in all, {self.done / el / 1e6:.0f} MB/s"
                    + (f"; now writing {self.desc}" if self.desc else ""))
        self.last_line = time.monotonic()
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.mode == "lines" and self.done and not self._closed:
            self.line()
        self._closed = True
