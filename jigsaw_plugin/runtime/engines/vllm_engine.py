"""One real vLLM rollout engine (v1 ``AsyncLLM``), and its Ray actor.

``VLLMEngine`` has the interface of the router's engines (``runtime/router.py``, the same
one ``runtime/emulated.py`` emulates):

* ``await generate(request_id, prompt_token_ids, max_tokens, *, greedy=True, on_progress=None)``
  streams one request and returns its generated token ids (exactly ``max_tokens`` of them:
  ``ignore_eos=True``). ``on_progress(n_tokens, token)`` is called once per new token, in order.
* ``await abort(request_id)`` stops the request and returns the tokens it had generated.
  **How an aborted ``generate`` ends:** it raises ``RequestAborted`` whose ``tokens`` are
  exactly the list ``abort`` returned (the router catches this exception: a subclass of
  the emulated engine's). Whichever of ``abort`` and normal completion reaches the
  request's state first wins, so a request ends exactly once: either ``generate``
  returns normally (and a later ``abort`` finds nothing: ``[]``, or ``RequestNotFound``
  with ``missing_ok=False``), or ``generate`` raises ``RequestAborted`` (and ``abort``
  returns the same tokens, possibly all ``max_tokens`` of them if the request completed
  while the abort was in flight).
* ``await load_weights(state_dict)`` loads new weights into the running engine in place:
  the tensors travel as raw bytes through ``collective_rpc`` to a worker extension
  (``WorkerWeightsExtension``, installed with vLLM's ``worker_extension_cls``) that rebuilds
  them and calls the worker's own ``reload_weights(weights_iterator=...)`` (the model's
  ``load_weights``); then the prefix cache is reset. Requests in flight are not paused: their next tokens come from
  the new weights (AReaL-style interruptible rollout); pause or drain first for on-policy.
* ``await load()`` requests in flight; ``await progress(request_id)`` its tokens so far;
  ``shutdown()``.

Everything runs on the event loop the engine is first used from: create the engine and
call it from that one loop (vLLM's output handler and ZMQ sockets are bound to it).

vLLM and Ray are imported inside functions and methods only: this module imports without
either installed (the core test suite does).

``make_engine_actor`` starts one engine in a Ray actor that claims one unit of a custom
resource (``jigsaw_device`` by default: one device of the pool; on CPU one core), and
``ActorEngine`` wraps the actor handle into the same async interface (``RequestAborted``
unwrapped from Ray's task error; ``on_progress`` is not forwarded across processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from jigsaw_plugin.runtime import emulated as _emulated

__all__ = [
    "VLLMEngine",
    "RequestAborted",
    "RequestNotFound",
    "EngineDead",
    "ActorEngine",
    "engine_actor_class",
    "make_engine_actor",
]

EngineDead = _emulated.EngineDead


class RequestAborted(_emulated.RequestAborted):
    """``generate`` ended by ``abort``; ``tokens`` holds what it had generated.

    A subclass of the emulated engine's exception (the router catches that one) that
    survives pickling, so it crosses Ray actor boundaries with its tokens."""

    def __reduce__(self):
        return (type(self), (self.request_id, list(self.tokens)))


class RequestNotFound(LookupError):
    """``abort(..., missing_ok=False)`` of a request not in flight on this engine (it never
    started here, or it has already finished: its ``generate`` returned normally)."""


@dataclass
class _Req:
    tokens: list = field(default_factory=list)
    aborted: bool = False
    killed: bool = False  # the engine was shut down under it
    task: asyncio.Task | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.contextmanager
def _environ(values: dict):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class VLLMEngine:
    """One vLLM v1 ``AsyncLLM`` serving token ids (no tokenizer). See the module docstring.

    ``kv_cache_space_gib`` sets ``VLLM_CPU_KVCACHE_SPACE`` (the KV cache of a CPU engine,
    GiB) and ``omp_threads_bind`` sets ``VLLM_CPU_OMP_THREADS_BIND`` (e.g. ``"0"``: pin the
    worker's OpenMP threads to core 0; ``None`` keeps vLLM's ``auto``, which picks cores per
    NUMA node without knowing of other engines, so engines on one node can land on the same
    cores), both only for the engine processes
    started by this constructor. Other keyword arguments go to ``AsyncEngineArgs``.
    """

    backend = "vllm"

    def __init__(self, model_path, *, max_model_len: int = 2048, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.05, kv_cache_space_gib: int | None = 1,
                 omp_threads_bind: str | None = None, seed: int = 0, **engine_args):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.model_path = str(Path(model_path))
        args = AsyncEngineArgs(
            model=self.model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=True,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            worker_extension_cls=engine_args.pop("worker_extension_cls", _EXTENSION),
            disable_log_stats=engine_args.pop("disable_log_stats", True),
            **engine_args,
        )
        env = {}
        if kv_cache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = int(kv_cache_space_gib)
        if omp_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind
        with _environ(env):
            self._llm = AsyncLLM.from_engine_args(args)
        self._reqs: dict[str, _Req] = {}
        self.weight_version = 0
        self.dead = False

    # ---- requests -----------------------------------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids, max_tokens: int, *, greedy: bool = True,
                       on_progress=None, temperature: float = 1.0, sampling_seed: int | None = None) -> list[int]:
        """Generate exactly ``max_tokens`` tokens after the prompt (EOS ignored); returns
        them. Raises ``RequestAborted`` if ``abort`` stopped it, ``EngineDead`` if the
        engine is gone. ``greedy=False`` samples at ``temperature`` (``sampling_seed`` for a
        reproducible draw)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.dead:
            raise EngineDead(f"engine is shut down; request {request_id} not accepted")
        if request_id in self._reqs:
            raise ValueError(f"request {request_id} is already running on this engine")
        req = self._reqs[request_id] = _Req(task=asyncio.current_task())
        try:
            if max_tokens <= 0:
                return []
            params = SamplingParams(
                max_tokens=int(max_tokens),
                ignore_eos=True,
                detokenize=False,
                temperature=0.0 if greedy else float(temperature),
                seed=sampling_seed,
                output_kind=RequestOutputKind.DELTA,
            )
            prompt = TokensPrompt(prompt_token_ids=[int(t) for t in prompt_token_ids])
            stream = self._llm.generate(prompt, params, request_id)
            try:
                async for out in stream:
                    new = out.outputs[0].token_ids if out.outputs else ()
                    for token in new:
                        req.tokens.append(int(token))
                        if on_progress is not None:
                            on_progress(len(req.tokens), int(token))
                    if out.finished:
                        if out.outputs and out.outputs[0].finish_reason == "abort":
                            req.aborted = True
                        break
                    if req.aborted:
                        break  # abort() came before vLLM knew the request: closing aborts it
            finally:
                await stream.aclose()
            if req.aborted:
                raise RequestAborted(request_id, list(req.tokens))
            return list(req.tokens)
        except EngineDeadError as e:
            self.dead = True
            raise EngineDead(f"engine died with {request_id} in flight ({len(req.tokens)} tokens)") from e
        except asyncio.CancelledError:
            if req.killed:
                raise EngineDead(f"engine shut down with {request_id} in flight ({len(req.tokens)} tokens)") from None
            raise
        finally:
            self._reqs.pop(request_id, None)
            req.done.set()

    async def abort(self, request_id: str, *, missing_ok: bool = True) -> list[int]:
        """Abort the request; returns the tokens it generated (the same list its
        ``generate`` raises ``RequestAborted`` with). A request not in flight here returns
        ``[]``, or raises ``RequestNotFound`` when ``missing_ok`` is false."""
        req = self._reqs.get(request_id)
        if req is None or req.done.is_set():
            if missing_ok:
                return []
            raise RequestNotFound(f"request {request_id} is not in flight on this engine")
        req.aborted = True  # claimed: from here on the request ends as aborted
        if not self.dead:
            await self._llm.abort(request_id)
        await req.done.wait()
        return list(req.tokens)

    async def load(self) -> int:
        """Requests in flight on this engine."""
        return len(self._reqs)

    async def progress(self, request_id: str) -> int | None:
        """Tokens generated so far by a request in flight here (``None``: not in flight)."""
        req = self._reqs.get(request_id)
        return None if req is None else len(req.tokens)

    # ---- weights ------------------------------------------------------------------------
    async def load_weights(self, state_dict, version: int | None = None) -> None:
        """Load ``state_dict`` (checkpoint names, e.g. a HF model's ``state_dict()``) into
        the running engine in place, then drop the prefix cache (its KV came from the old
        weights). Tensors are shipped to the worker process through vLLM's utility RPC."""
        if self.dead:
            raise EngineDead("engine is shut down; cannot load weights")
        payload = [_tensor_to_wire(str(k), v) for k, v in dict(state_dict).items()]
        await self._llm.collective_rpc("jigsaw_load_weights", args=(payload,))
        await self._llm.reset_prefix_cache()
        self.weight_version = self.weight_version + 1 if version is None else int(version)

    # ---- lifetime -----------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the engine processes. In-flight ``generate`` calls end with ``EngineDead``."""
        self.dead = True
        for req in self._reqs.values():
            if req.task is not None and not req.done.is_set():
                req.killed = True
                req.task.cancel()
        if self._llm is not None:
            self._llm.shutdown()
        # Dropping the AsyncLLM now lets its __del__ (a second, harmless shutdown) run
        # while the interpreter is whole, not during interpreter teardown.
        self._llm = None

    async def ping(self) -> bool:
        return not self.dead


# ---- weights into a running engine ---------------------------------------------------------
# vLLM's utility RPC encodes its arguments with msgpack, and a torch tensor inside a plain
# argument list does not come back as a tensor on the worker (it arrives as a list). So
# tensors travel as (name, dtype, shape, raw bytes) and the worker rebuilds them.

_EXTENSION = "jigsaw_plugin.runtime.engines.vllm_engine.WorkerWeightsExtension"


def _tensor_to_wire(name: str, tensor) -> list:
    import torch

    t = tensor.detach().to("cpu").contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    return [name, dtype, list(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes()]


class WorkerWeightsExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): methods callable with
    ``collective_rpc``. Runs in the worker process, next to the model."""

    def jigsaw_load_weights(self, payload) -> int:
        import torch

        weights = []
        for name, dtype, shape, buf in payload:
            dt = getattr(torch, dtype)
            if buf:
                t = torch.frombuffer(bytearray(buf), dtype=dt).reshape(shape)
            else:
                t = torch.empty(shape, dtype=dt)
            weights.append((name, t))
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        return len(weights)


# ---- Ray ------------------------------------------------------------------------------------
class _EngineActorImpl:
    """The body of the Ray actor: a ``VLLMEngine`` created on the actor's event loop at
    the first call (``await actor.start.remote()`` to pay the start-up up front)."""

    def __init__(self, model_path, engine_kwargs: dict):
        self._model_path = model_path
        self._kwargs = dict(engine_kwargs)
        self._pin = self._kwargs.pop("pin_devices", None)  # CPU: run on these devices' cores only
        self._engine: VLLMEngine | None = None
        self._lock: asyncio.Lock | None = None
        self._reaper = None

    async def _get(self) -> VLLMEngine:
        if self._engine is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._engine is None:
                    self._engine = VLLMEngine(self._model_path, **self._kwargs)
                    # if Ray kills this actor (owner died, ray.kill), vLLM's processes go too
                    from jigsaw_plugin.runtime.engines.reaper import start_reaper

                    self._reaper = start_reaper()
                    if self._pin is not None:
                        from jigsaw_plugin.runtime.cpu_affinity import pin_process_tree

                        pin_process_tree(os.getpid(), self._pin)
        return self._engine

    async def pids(self) -> list[int]:
        """This actor's pid and its vLLM processes' (for tests of clean-up)."""
        import psutil

        await self._get()
        return [os.getpid()] + [c.pid for c in psutil.Process().children(recursive=True)
                                if c.pid != getattr(self._reaper, "pid", None)]

    async def start(self) -> bool:
        await self._get()
        return True

    async def generate(self, request_id, prompt_token_ids, max_tokens, greedy=True, temperature=1.0,
                       sampling_seed=None):
        engine = await self._get()
        return await engine.generate(request_id, prompt_token_ids, max_tokens, greedy=greedy,
                                     temperature=temperature, sampling_seed=sampling_seed)

    async def abort(self, request_id, missing_ok=True):
        return await (await self._get()).abort(request_id, missing_ok=missing_ok)

    async def load(self):
        return await (await self._get()).load()

    async def progress(self, request_id):
        return await (await self._get()).progress(request_id)

    async def load_weights(self, state_dict, version=None):
        await (await self._get()).load_weights(state_dict, version)

    async def shutdown(self):
        if self._engine is not None:
            self._engine.shutdown()


_ACTOR_CLASS = None


def engine_actor_class():
    """``ray.remote(_EngineActorImpl)`` (made on first use: Ray is imported here)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        _ACTOR_CLASS = ray.remote(_EngineActorImpl)
    return _ACTOR_CLASS


def __getattr__(name):  # EngineActor, without importing Ray at module import
    if name == "EngineActor":
        return engine_actor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_engine_actor(model_path, device_resource: str = "jigsaw_device", *, num_cpus: float = 0,
                      max_concurrency: int = 1000, **engine_kwargs):
    """Start an engine actor holding one ``device_resource`` (one device of the pool).

    ``num_cpus`` is 0 by default: on CPU the device resource already stands for the core
    the engine computes on (``ray.init(num_cpus=2, resources={"jigsaw_device": 2})``), and
    claiming a Ray CPU as well would count that core twice and leave none to the driver's
    own tasks. ``engine_kwargs`` go to ``VLLMEngine``. Returns the actor handle; wrap it in
    ``ActorEngine`` for the engine interface.

    Stop it with ``handle.shutdown.remote()`` (or ``ActorEngine.shutdown()``) before
    ``ray.kill`` or ``ray.shutdown``: an actor killed first leaves vLLM's engine-core and
    worker processes running (and spinning) for a minute or more."""
    cls = engine_actor_class()
    return cls.options(num_cpus=num_cpus, resources={device_resource: 1},
                       max_concurrency=max_concurrency).remote(str(model_path), engine_kwargs)


class ActorEngine:
    """An engine actor handle behind the ``VLLMEngine`` interface (for the router and
    ``migrate``). ``on_progress`` is accepted but not called: progress callbacks do not
    cross processes."""

    backend = "vllm"

    def __init__(self, handle):
        self.handle = handle

    @staticmethod
    def _unwrap(err):
        cause = getattr(err, "cause", None)
        return cause if isinstance(cause, BaseException) else err

    async def _call(self, method, *args, **kwargs):
        import ray

        try:
            return await getattr(self.handle, method).remote(*args, **kwargs)
        except ray.exceptions.RayTaskError as e:
            cause = self._unwrap(e)
            if isinstance(cause, (RequestAborted, RequestNotFound, EngineDead, ValueError)):
                raise cause from None
            raise
        except ray.exceptions.RayActorError as e:
            raise EngineDead(f"engine actor died: {e}") from e

    async def start(self) -> bool:
        return await self._call("start")

    async def generate(self, request_id, prompt_token_ids, max_tokens, *, greedy=True, on_progress=None,
                       temperature=1.0, sampling_seed=None):
        return await self._call("generate", request_id, list(prompt_token_ids), int(max_tokens), greedy,
                                temperature, sampling_seed)

    async def abort(self, request_id, *, missing_ok=True):
        return await self._call("abort", request_id, missing_ok)

    async def load(self):
        return await self._call("load")

    async def progress(self, request_id):
        return await self._call("progress", request_id)

    async def load_weights(self, state_dict, version=None):
        return await self._call("load_weights", state_dict, version)

    def shutdown(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.get(self.handle.shutdown.remote(), timeout=60)
        ray.kill(self.handle)
