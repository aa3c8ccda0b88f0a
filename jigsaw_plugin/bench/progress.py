"""Progress of long runs on stderr, and the CLI's logging set-up.

Progress (a live line: simulated seconds and steps, or a spinner with the elapsed time
of a real run) is shown only when stderr is a terminal and ``--quiet`` is not given; it
goes through rich when rich is installed (it is not a dependency) and through a plain
``\\r`` line otherwise. Messages (engine start, each real run) go through ``logging``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from jigsaw_plugin.hookspecs import hookimpl

__all__ = ["LOGGER_NAME", "setup_logging", "progress_enabled", "SimProgress", "Activity"]

LOGGER_NAME = "jigsaw_plugin"
_MIN_REFRESH_S = 0.25  # wall seconds between two redraws of a plain progress line
_HANDLER: logging.Handler | None = None  # the CLI's stderr handler


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    """``jigsaw`` messages to stderr: INFO by default, DEBUG with ``-v``, WARNING with ``-q``."""
    level = logging.WARNING if quiet else (logging.DEBUG if verbose else logging.INFO)
    global _HANDLER
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    if _HANDLER is not None:  # one handler however often main() runs in a process
        logger.removeHandler(_HANDLER)
    _HANDLER = logging.StreamHandler(sys.stderr)  # the stderr of now (tests swap it)
    _HANDLER.setFormatter(logging.Formatter("jigsaw: %(message)s"))
    logger.addHandler(_HANDLER)
    logger.propagate = False


def progress_enabled(quiet: bool, stream=None) -> bool:
    stream = stream or sys.stderr
    return not quiet and hasattr(stream, "isatty") and stream.isatty()


def _rich_progress(stream):
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                    TextColumn("{task.fields[sim_s]}"), TimeElapsedColumn(), console=Console(file=stream),
                    transient=True)


class SimProgress:
    """A plugin (register it on the run's plugin manager): every finished step advances
    the bar; the text says the simulated seconds reached.

    Use as a context manager around ``Simulation.run()``; it draws nothing when disabled."""

    def __init__(self, label: str, total_steps: int, enabled: bool, stream=None):
        self.label, self.total_steps, self.enabled = label, total_steps, enabled
        self.stream = stream or sys.stderr
        self.steps, self.sim_s, self._last = 0, 0.0, 0.0
        self._rich = self._task = None

    def __enter__(self):
        if self.enabled:
            self._rich = _rich_progress(self.stream)
            if self._rich is not None:
                self._rich.start()
                self._task = self._rich.add_task(self.label, total=self.total_steps, sim_s="")
        return self

    def __exit__(self, *exc):
        if self._rich is not None:
            self._rich.stop()
        elif self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()

    @hookimpl
    def jigsaw_step_end(self, pipeline, step, t):
        self.steps += 1
        self.sim_s = max(self.sim_s, float(t))
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        text = f"{self.sim_s:,.0f} s simulated"
        if self._rich is not None:
            self._rich.update(self._task, completed=self.steps, sim_s=text)
            return
        now = time.monotonic()
        if now - self._last >= _MIN_REFRESH_S or self.steps == self.total_steps:
            self._last = now
            self.stream.write(f"\r\033[K{self.label}: {self.steps}/{self.total_steps} steps, {text}")
            self.stream.flush()


class Activity:
    """A spinner with the elapsed wall time and the latest message, for work whose steps
    happen elsewhere (a real run in the coordinator). ``update(msg)`` also logs ``msg``."""

    def __init__(self, label: str, enabled: bool, stream=None):
        self.label, self.enabled = label, enabled
        self.stream = stream or sys.stderr
        self.message = ""
        self._t0 = time.monotonic()
        self._status = self._thread = None
        self._stop = threading.Event()
        self._log = logging.getLogger(LOGGER_NAME)

    def __enter__(self):
        if not self.enabled:
            return self
        try:
            from rich.console import Console

            self._status = Console(file=self.stream).status(self._text())
            self._status.start()
        except ImportError:
            pass
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._status is not None:
            self._status.stop()
        elif self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def update(self, message: str) -> None:
        self.message = message
        self._log.info(message)

    def _text(self) -> str:
        elapsed = int(time.monotonic() - self._t0)
        return f"{self.label} ({elapsed // 60}m{elapsed % 60:02d}s) {self.message}"

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            if self._status is not None:
                self._status.update(self._text())
            else:
                self.stream.write("\r\033[K" + self._text()[:120])
                self.stream.flush()
