"""A tool server process for agentic pipelines: a search tool and a sandboxed reward over HTTP.

It stands in for a remote tool / sandbox cluster on one machine: a separate Python process
(stdlib ``http.server``, one thread per request) answering on loopback, started and
stopped by the runner (``ToolServer``), on a free port it picks itself. Endpoints (JSON in,
JSON out):

- ``POST /tool`` ``{pipeline, request_id, turn, query[, latency_s, observation_tokens]}``:
  waits the tool's latency, then returns ``{observation, latency_s}``: the search results,
  token ids derived from the query (deterministic), ``observation_tokens`` long.
- ``POST /reward`` ``{pipeline, request_id, response[, mask, latency_s]}``: runs the reward
  check in a **subprocess** with a timeout (the sandbox): it takes ``latency_s`` to run and
  returns the rule reward of the generated tokens (reward.py's ``id < 1024`` fraction);
  ``{reward, latency_s, sandbox_s}``. A check that overruns ``sandbox_timeout_s`` is
  killed and answered ``504`` with a message naming the request, its latency and the limit.
- ``GET /health`` ``{ok, pid}``; ``POST /shutdown``.

Latencies and observation lengths come from the workload's distributions
(``tool_latency_s``, ``observation_len``, ``reward.latency_s``), drawn with a generator
seeded by (seed, pipeline, request, turn), so a request gets the same draw in every run.
A request may instead carry the value (``latency_s``, ``observation_tokens``): the live
executor sends its workload sampler's draws, so both policies of an A/B and the
simulator's prediction see the same latencies. A bad request gets ``400`` with a
``SpecError``-style message (field, value, what is allowed); the client raises it as
``ToolServerError``.

No orphans: the server exits when its parent process goes (it polls its parent id), and
``ToolServer.stop`` asks it to shut down, then terminates and finally kills it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field

__all__ = [
    "ToolPipelineConfig", "ToolServerConfig", "ToolServer", "ToolClient", "ToolReply", "RewardReply",
    "ToolServerError", "tool_server_config", "needs_tool_server", "SANDBOX_CHECK",
]

DEFAULT_SANDBOX_TIMEOUT_S = 10.0
_VOCAB = 2048  # tiny-qwen2's vocabulary: observations are token ids below it

# The sandboxed reward check (run with ``python -S -c``): the sandbox's run time, then the
# reward rule of reward.py on the generated tokens. Kept self-contained (no imports of
# this package) so that it runs in a bare interpreter.
SANDBOX_CHECK = """
import json, sys, time
job = json.loads(sys.stdin.read())
time.sleep(job["latency_s"])
ids = [t for t, m in zip(job["response"], job["mask"]) if m]
print(json.dumps({"reward": (sum(1 for t in ids if t < job["threshold"]) / len(ids)) if ids else 0.0}))
"""


class ToolServerError(RuntimeError):
    """A tool or reward call the server refused (bad request, sandbox timeout) or could not answer."""


@dataclass(frozen=True)
class ToolPipelineConfig:
    """What the server draws for one pipeline: distributions in their spec form (DESIGN.md 4)."""

    name: str
    tool_latency_s: dict | None  # None: the pipeline makes no tool calls
    observation_len: dict | None
    reward_latency_s: dict
    reward_threshold: int = 1024  # reward.py's VOCAB_HALF


@dataclass(frozen=True)
class ToolServerConfig:
    """The server's whole configuration; crosses to the server process as JSON."""

    pipelines: tuple[ToolPipelineConfig, ...]
    seed: int = 0
    sandbox_timeout_s: float = DEFAULT_SANDBOX_TIMEOUT_S
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port, chosen by the OS

    def __post_init__(self):
        from jigsaw_plugin.errors import SpecError

        if not (isinstance(self.sandbox_timeout_s, (int, float)) and self.sandbox_timeout_s > 0):
            raise SpecError("sandbox_timeout_s", self.sandbox_timeout_s, "a number of seconds > 0")
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise SpecError("host", self.host, "a loopback address (127.0.0.1, localhost, ::1)")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> "ToolServerConfig":
        d = json.loads(text)
        return ToolServerConfig(tuple(ToolPipelineConfig(**p) for p in d.pop("pipelines")), **d)


def needs_tool_server(workload) -> bool:
    """Whether any pipeline calls tools (``turns``) or has a sandboxed reward."""
    return any(p.agentic or p.reward.kind == "sandbox" for p in workload.pipelines)


def tool_server_config(workload, seed: int = 0, sandbox_timeout_s: float = DEFAULT_SANDBOX_TIMEOUT_S
                       ) -> ToolServerConfig:
    """The server's configuration for a parsed workload (its pipelines' distributions)."""
    pipes = tuple(ToolPipelineConfig(
        p.name, p.tool_latency_s.to_dict() if p.tool_latency_s is not None else None,
        p.observation_len.to_dict() if p.observation_len is not None else None,
        p.reward.latency_s.to_dict()) for p in workload.pipelines)
    return ToolServerConfig(pipes, seed=int(seed), sandbox_timeout_s=float(sandbox_timeout_s))


# ---- the server process -------------------------------------------------------------------
class _BadRequest(Exception):
    def __init__(self, field: str, value: object, allowed: str):
        super().__init__(f"{field}: got {value!r}; allowed: {allowed}")


class _Draws:
    """The pipelines' distributions, drawn per request with a seeded generator."""

    def __init__(self, config: ToolServerConfig):
        from jigsaw_plugin.workload.distributions import build_distribution

        self.seed = config.seed
        self.pipes = {}
        for p in config.pipelines:
            self.pipes[p.name] = {
                "tool_latency_s": build_distribution(p.tool_latency_s, "tool_latency_s") if p.tool_latency_s else None,
                "observation_len": (build_distribution(p.observation_len, "observation_len")
                                    if p.observation_len else None),
                "reward_latency_s": build_distribution(p.reward_latency_s, "reward.latency_s"),
                "threshold": p.reward_threshold,
            }

    def pipeline(self, name) -> dict:
        if name not in self.pipes:
            raise _BadRequest("pipeline", name, ", ".join(sorted(self.pipes)))
        return self.pipes[name]

    def draw(self, dist, *key) -> float:
        import numpy as np

        words = [self.seed] + [zlib.crc32(str(k).encode()) for k in key]
        return float(dist.sample(np.random.default_rng(words), 1)[0])


def _field(body: dict, key: str, kind, allowed: str, optional: bool = False):
    if key not in body:
        if optional:
            return None
        raise _BadRequest(key, None, f"{allowed} (required)")
    v = body[key]
    ok = {"str": isinstance(v, str) and v != "",
          "int>=0": isinstance(v, int) and not isinstance(v, bool) and v >= 0,
          "seconds": isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 3600,
          "tokens": isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                for t in v)}[kind]
    if not ok:
        raise _BadRequest(key, v, allowed)
    return v


def _observation(pipeline: str, request_id: str, turn: int, query: list, n: int) -> list[int]:
    """The tool's answer: ``n`` token ids that depend on the request and its query."""
    base = zlib.crc32(f"{pipeline}/{request_id}/{turn}/{query[-16:]}".encode())
    return [(base + 7919 * j) % _VOCAB for j in range(int(n))]


def _make_handler(config: ToolServerConfig, draws: _Draws, stop):
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the runner's log is the event log
            pass

        def _reply(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._reply(200, {"ok": True, "pid": os.getpid()})
            self._reply(404, {"error": f"path: got {self.path!r}; allowed: GET /health, POST /tool, /reward, "
                                       f"/shutdown"})

        def do_POST(self):
            try:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                if self.path == "/shutdown":
                    self._reply(200, {"ok": True})
                    return stop()
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    raise _BadRequest("body", raw[:80].decode(errors="replace"), "a JSON object") from None
                if not isinstance(body, dict):
                    raise _BadRequest("body", body, "a JSON object")
                if self.path == "/tool":
                    return self._reply(200, self._tool(body))
                if self.path == "/reward":
                    code, out = self._reward(body)
                    return self._reply(code, out)
                self._reply(404, {"error": f"path: got {self.path!r}; allowed: POST /tool, /reward, /shutdown"})
            except _BadRequest as e:
                self._reply(400, {"error": str(e)})

        def _tool(self, body: dict) -> dict:
            name = _field(body, "pipeline", "str", "a pipeline name")
            pipe = draws.pipeline(name)
            rid = _field(body, "request_id", "str", "a request id")
            turn = _field(body, "turn", "int>=0", "an integer >= 0")
            query = _field(body, "query", "tokens", "a list of token ids >= 0")
            if pipe["tool_latency_s"] is None:
                raise _BadRequest("pipeline", name, "a pipeline with tool calls (its workload has no turns)")
            latency = _field(body, "latency_s", "seconds", "seconds in [0, 3600)", optional=True)
            if latency is None:
                latency = draws.draw(pipe["tool_latency_s"], name, rid, turn, "tool")
            n = _field(body, "observation_tokens", "int>=0", "an integer >= 0", optional=True)
            if n is None:
                n = int(round(draws.draw(pipe["observation_len"], name, rid, turn, "obs")))
            time.sleep(latency)  # the remote tool's latency: this thread waits, the others serve
            return {"observation": _observation(name, rid, turn, query, n), "latency_s": latency}

        def _reward(self, body: dict) -> tuple[int, dict]:
            name = _field(body, "pipeline", "str", "a pipeline name")
            pipe = draws.pipeline(name)
            rid = _field(body, "request_id", "str", "a request id")
            response = _field(body, "response", "tokens", "a list of token ids >= 0")
            mask = _field(body, "mask", "tokens", "a list of 0/1, one per response token", optional=True)
            if mask is None:
                mask = [1] * len(response)
            if len(mask) != len(response) or any(m not in (0, 1) for m in mask):
                raise _BadRequest("mask", mask[:16], f"a list of 0/1 of the response's length ({len(response)})")
            latency = _field(body, "latency_s", "seconds", "seconds in [0, 3600)", optional=True)
            if latency is None:
                latency = draws.draw(pipe["reward_latency_s"], name, rid, "reward")
            job = json.dumps({"latency_s": latency, "response": response, "mask": mask,
                              "threshold": pipe["threshold"]})
            t0 = time.perf_counter()
            try:  # the sandbox: a separate interpreter, killed at the timeout
                done = subprocess.run([sys.executable, "-S", "-c", SANDBOX_CHECK], input=job, capture_output=True,
                                      text=True, timeout=config.sandbox_timeout_s)
            except subprocess.TimeoutExpired:
                return 504, {"error": f"sandbox: the reward check of {name} request {rid} ran past "
                                      f"sandbox_timeout_s={config.sandbox_timeout_s:g} s (its latency: "
                                      f"{latency:.3f} s) and was killed"}
            if done.returncode != 0:
                return 500, {"error": f"sandbox: the reward check of {name} request {rid} exited "
                                      f"{done.returncode}: {done.stderr.strip()[-300:]}"}
            out = json.loads(done.stdout)
            return 200, {"reward": out["reward"], "latency_s": latency, "sandbox_s": time.perf_counter() - t0}

    return Handler


def _watch_parent(parent: int, stop) -> None:
    """Exit when the process that started the server is gone (no orphan servers)."""
    while True:
        time.sleep(0.2)
        if os.getppid() != parent:
            stop()
            return


def serve(config: ToolServerConfig, parent: int | None = None, out=None) -> None:
    """Run the server until ``/shutdown`` or the parent's exit; prints ``READY <port> <pid>``."""
    from http.server import ThreadingHTTPServer

    draws = _Draws(config)
    done = threading.Event()
    class _Server(ThreadingHTTPServer):
        request_queue_size = 512  # a step's trajectories connect at once (the default 5 drops SYNs: 1 s retries)
        daemon_threads = True

    server = _Server((config.host, config.port), None)
    server.RequestHandlerClass = _make_handler(config, draws, done.set)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    if parent is not None:
        threading.Thread(target=_watch_parent, args=(parent, done.set), daemon=True).start()
    out = out or sys.stdout
    print(f"READY {server.server_address[1]} {os.getpid()}", file=out, flush=True)
    done.wait()
    server.shutdown()
    server.server_close()


# ---- the runner's side ----------------------------------------------------------------------
class ToolServer:
    """Starts the server process on a free loopback port; ``stop()`` (or the ``with``
    block's end) ends it, and it ends itself if this process goes."""

    def __init__(self, config: ToolServerConfig, start_timeout_s: float = 30.0):
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise ToolServerError("the tool server is not running (call start() first)")
        return f"http://{self.config.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "ToolServer":
        if self.proc is not None:
            return self
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jigsaw_plugin.runtime.tool_server", "--parent", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.proc.stdin.write(self.config.to_json())
        self.proc.stdin.close()
        line = _readline(self.proc.stdout, self.start_timeout_s)
        if not line.startswith("READY "):
            err = ""
            try:
                self.proc.kill()
                err = self.proc.communicate(timeout=5)[1]
            except Exception:
                pass
            self.proc = None
            raise ToolServerError(f"the tool server did not start: {(line or err).strip()[-500:]}")
        self.port = int(line.split()[1])
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Shut the server down and reap it (terminate, then kill, if it does not go)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                _post_blocking(self.url, "/shutdown", {}, timeout_s=timeout_s)
            except OSError:
                pass
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        self.port = None

    def __enter__(self) -> "ToolServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _readline(stream, timeout_s: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout_s)
    return box[0] if box else ""


def _post_blocking(url: str, path: str, body: dict, timeout_s: float) -> dict:
    import urllib.request

    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


@dataclass(frozen=True)
class ToolReply:
    observation: tuple[int, ...]
    latency_s: float  # the tool's latency (the server's wait)
    wall_s: float  # the call as the client saw it (HTTP round trip included)


@dataclass(frozen=True)
class RewardReply:
    reward: float
    latency_s: float  # the sandbox's run time
    sandbox_s: float  # the subprocess's wall time on the server
    wall_s: float


@dataclass
class ToolClient:
    """Async HTTP/1.1 calls to a tool server, on the caller's event loop (no thread per call:
    32 trajectories can wait on their tools at once while the loop serves the engines)."""

    url: str
    timeout_s: float = 60.0
    calls: int = field(default=0, init=False)

    def __post_init__(self):
        from urllib.parse import urlsplit

        u = urlsplit(self.url)
        if u.scheme != "http" or not u.hostname or not u.port:
            from jigsaw_plugin.errors import SpecError

            raise SpecError("tool_server_url", self.url, "http://HOST:PORT (the ToolServer's url)")
        self._host, self._port = u.hostname, u.port

    async def post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        reader, writer = await asyncio.open_connection(self._host, self._port)
        try:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), self.timeout_s)
        finally:
            writer.close()
        self.calls += 1
        head, _, payload = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        try:
            out = json.loads(payload or b"{}")
        except ValueError:
            out = {"error": payload[:200].decode(errors="replace")}
        if status != 200:
            raise ToolServerError(f"tool server {path} answered {status}: {out.get('error', out)}")
        out["wall_s"] = time.perf_counter() - t0
        return out

    async def tool(self, pipeline: str, request_id: str, turn: int, query, latency_s: float | None = None,
                   observation_tokens: int | None = None) -> ToolReply:
        body = {"pipeline": pipeline, "request_id": request_id, "turn": turn, "query": list(query)}
        if latency_s is not None:
            body["latency_s"] = latency_s
        if observation_tokens is not None:
            body["observation_tokens"] = observation_tokens
        out = await self.post("/tool", body)
        return ToolReply(tuple(out["observation"]), float(out["latency_s"]), float(out["wall_s"]))

    async def reward(self, pipeline: str, request_id: str, response, mask=None,
                     latency_s: float | None = None) -> RewardReply:
        body = {"pipeline": pipeline, "request_id": request_id, "response": list(response)}
        if mask is not None:
            body["mask"] = list(mask)
        if latency_s is not None:
            body["latency_s"] = latency_s
        out = await self.post("/reward", body)
        return RewardReply(float(out["reward"]), float(out["latency_s"]), float(out["sandbox_s"]),
                           float(out["wall_s"]))


def _main(argv: list[str]) -> int:
    parent = None
    if "--parent" in argv:
        parent = int(argv[argv.index("--parent") + 1])
    serve(ToolServerConfig.from_json(sys.stdin.read()), parent=parent)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
