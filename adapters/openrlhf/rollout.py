"""Rollout control: OpenRLHF's ``SamplesGenerator`` with per-request routing and migration.

OpenRLHF sends one call per prompt (all n samples) to the engine with the fewest
unfinished requests, from a snapshot, and never moves work afterwards
(``ppo_utils/samples_generator.py:195-241``). ``JigsawSamplesGenerator`` keeps everything
else of the class (prompt batches, buffering, ``_process_response_into_experience``,
dynamic filtering) and replaces ``_generate_vllm`` (140-193):

* the agent executor OpenRLHF would run inside each engine actor (single-turn with the
  reward function/URL, or the user's ``--train.agent_func_path``: ``vllm_engine.py:53-58``)
  runs here, in the trainer, once per sample; its ``llm_engine.generate`` call, one per
  turn, is a *request* sent through jigsaw's ``Router`` (least in flight, sticky per
  sample), so requests, not prompts, are balanced;
* policy ``jigsaw`` under a coordinator policy (``hooks.planned``, two or more engines): the
  coordinator's policy chooses which requests move (``host.py``: ``migration``); the
  controller takes its commands each poll and carries them out (``policy_moves.py``: abort +
  resume with the prefix), switches off an engine the policy emptied and gives its device
  back mid-rollout, and reports each command's outcome; the tail rule below is not applied;
* policy ``jigsaw`` otherwise (alone, or under ``fifo-lease``): when the step's requests in
  flight fall to ``tail_fraction`` of those submitted, the long tail is consolidated: the
  requests of every other busy engine are moved to the busiest one (abort + resume with the
  generated prefix, ``Router.drain_to``: each exactly once) once each has
  ``migrate_min_tokens`` tokens, and the emptied engines are switched off and their devices
  released (to the shared pool when a coordinator is used). These knobs arrive as one
  ``MigrationSettings`` (``config.py``);
* the engine pool is pre-provisioned (OpenRLHF's engine list and weight-sync group are
  fixed at start): each step switches on the engines it gets devices for
  (``--jigsaw.active_engines``, or the lease granted) and off again after the tail.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, _collect_prompt_batch
from vllm import SamplingParams

from jigsaw_plugin.adapters.openrlhf.config import MigrationSettings
from jigsaw_plugin.adapters.openrlhf.engines import RequestState, RequestTable, RolloutEngine
from jigsaw_plugin.adapters.openrlhf.hooks import RunHooks
from jigsaw_plugin.adapters.openrlhf.host import moves_requests
from jigsaw_plugin.adapters.openrlhf.policy_moves import MOVED, PolicyMoves
from jigsaw_plugin.runtime.host_requests import MigrationOutcome
from jigsaw_plugin.runtime.router import Router, RouterError

__all__ = ["JigsawSamplesGenerator", "StepClock", "make_executor", "PROGRESS_REPORT_S"]

#: A request's progress is reported at most this often (the coordinator runs a policy round
#: on each report it receives; per poll, 8 requests x 20 polls/s would be 160 rounds/s).
PROGRESS_REPORT_S = 1.0


class StepClock:
    """The step counter of one trainer, shared by its generator and its hooks."""

    def __init__(self, hooks: RunHooks, emit_steps: bool = True):
        self.hooks, self.step, self.started, self.emit_steps = hooks, 0, False, emit_steps

    def begin(self) -> int:
        if not self.started:
            self.started = True
            if self.emit_steps:
                self.hooks.emit.jigsaw_step_start(pipeline=self.hooks.pipeline, step=self.step, t=self.hooks.now())
        return self.step

    def end(self) -> None:
        self.begin()
        if self.emit_steps:
            self.hooks.emit.jigsaw_step_end(pipeline=self.hooks.pipeline, step=self.step, t=self.hooks.now())
        self.step, self.started = self.step + 1, False


def make_executor(args):
    """The agent executor OpenRLHF's engine actor would build (``vllm_engine.py:53-58``)."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    if args.train.agent_func_path:
        return _load_agent_executor(args.train.agent_func_path)
    return SingleTurnAgentExecutor(args.reward.remote_url)


class _RoutedLLM:
    """What the executor sees as ``llm_engine``: each ``generate`` call is one routed request."""

    def __init__(self, gen: "JigsawSamplesGenerator", batch: "_Batch", sample_key: str):
        self.gen, self.batch, self.sample_key, self.turn = gen, batch, sample_key, 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        if multi_modal_data:
            raise NotImplementedError("jigsaw routes token-only requests; multimodal prompts are not supported yet")
        turn, self.turn = self.turn, self.turn + 1
        rid = f"{self.sample_key}-t{turn}"
        state = self.batch.table[rid] = RequestState(sampling_params, turn=turn)
        await self.batch.router.generate(rid, list(prompt_token_ids), int(sampling_params.max_tokens),
                                         sticky=self.sample_key)
        self.gen._request_hook("jigsaw_request_finished", rid, turn=turn, replica=state.replica,
                               generated_tokens=len(state.tokens))
        self.batch.on_response_done()
        text = self.gen.tokenizer.decode(state.tokens, skip_special_tokens=sampling_params.skip_special_tokens)
        completion = SimpleNamespace(token_ids=list(state.tokens), text=text,
                                     finish_reason=state.finish_reason or "length", logprobs=state.logprobs)
        return SimpleNamespace(outputs=[completion], prompt_token_ids=list(prompt_token_ids), finished=True)


class _Batch:
    """One ``_generate_vllm`` call: its router, request table, devices and reward window."""

    def __init__(self, gen, engine_ids, devices, step: int):
        self.gen, self.step = gen, step
        self.table = RequestTable()
        self.devices = dict(zip(engine_ids, devices))  # engine -> device id
        engines = {i: RolloutEngine(i, gen.vllm_engines[i], self.table, on_submit=gen._on_submit,
                                    on_abort=gen._on_abort) for i in engine_ids}
        self.router = Router(engines, on_event=gen._on_router_event)
        self.reward_started = False

    def on_response_done(self):
        if self.gen.reward_in_generation and not self.reward_started and self.gen.training_gen:
            self.reward_started = True  # the executor computes the reward right after generation
            self.gen._stage_event("jigsaw_stage_start", "reward", (), 0, 0)


class JigsawSamplesGenerator(SamplesGenerator):
    """See the module docstring. ``settings``: ``JigsawConfig.to_dict()`` (its ``migration``
    a ``MigrationSettings``)."""

    def __init__(self, strategy, prompts_dataloader, eval_dataloader, tokenizer, vllm_engines, *,
                 hooks: RunHooks, clock: StepClock, settings: dict):
        super().__init__(strategy=strategy, prompts_dataloader=prompts_dataloader, eval_dataloader=eval_dataloader,
                         tokenizer=tokenizer, vllm_engines=vllm_engines)
        self.hooks, self.clock, self.settings = hooks, clock, dict(settings)
        self.migration = self.settings.get("migration")
        if not isinstance(self.migration, MigrationSettings):
            raise TypeError(f"settings['migration'] must be a MigrationSettings (JigsawConfig.to_dict()); "
                            f"got {type(self.migration).__name__}")
        self.executor = make_executor(self.args)
        self.reward_in_generation = bool(self.args.reward.remote_url or self.args.train.agent_func_path)
        pool = len(self.vllm_engines)
        self.active = min(pool, int(self.settings.get("active_engines") or pool))
        self.training_gen = False
        self.batch: _Batch | None = None
        self.stats = {"requests": 0, "segments": 0, "migrations": 0, "switched_off": 0, "by_engine": {},
                      "policy_commands": 0, "policy_dropped": 0}
        self._seq = 0
        # under a coordinator policy the policy chooses the moves (host.py), not the tail rule
        self.follow_policy = hooks.planned and moves_requests(self.settings.get("policy"), len(self.vllm_engines))
        self._progress_t: dict[str, float] = {}  # request -> when its progress was last reported

    # ---- OpenRLHF entry points ----------------------------------------------------------
    def generate_samples(self, **generate_kwargs):
        # step_start fires when this step's generation really begins (in _generate) or, for a
        # batch served from the buffer, when training begins: a call that only finds the
        # loader exhausted starts no step.
        self.training_gen = True
        try:
            return super().generate_samples(**generate_kwargs)
        finally:
            self.training_gen = False
            if not self.clock.emit_steps:  # async mode: this clock counts generated batches
                self.clock.end()

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        if not prompts:
            return [], 0, True
        if not self.vllm_engines:
            raise RuntimeError("jigsaw rollout control needs vLLM engines (--vllm.num_engines >= 1)")
        return asyncio.run(self._generate(dataloader_iter, prompts, labels, images, exhausted, dynamic_filtering,
                                          generate_kwargs))

    # ---- one batch ----------------------------------------------------------------------
    def _sampling_params(self, generate_kwargs) -> SamplingParams:
        # The same parameters as SamplesGenerator._dispatch_prompts_to_vllm (samples_generator.py:199-207).
        return SamplingParams(
            temperature=generate_kwargs.get("temperature", 1.0),
            top_p=generate_kwargs.get("top_p", 1.0),
            top_k=generate_kwargs.get("top_k", -1),
            max_tokens=generate_kwargs.get("max_new_tokens"),
            min_tokens=generate_kwargs.get("min_new_tokens", 1),
            skip_special_tokens=generate_kwargs.get("skip_special_tokens", False),
            logprobs=1 if self.args.algo.advantage.is_correction_level != "off" else None,
        )

    async def _generate(self, dataloader_iter, prompts, labels, images, exhausted, dynamic_filtering, kw):
        sampling_params = self._sampling_params(kw)
        max_length = kw.get("max_len", 2048)
        n_samples = kw.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        step = self.clock.begin() if self.training_gen else self.clock.step

        devices = self.hooks.acquire("rollout", self.active, step=step, stage="gen")
        if len(devices) > len(self.vllm_engines):  # the declared pool (host.py) bounds a policy's grant
            raise RuntimeError(f"{self.hooks.pipeline}: granted {len(devices)} rollout devices {list(devices)}, "
                               f"but the run has {len(self.vllm_engines)} engine(s) (--vllm.num_engines)")
        # engine i of OpenRLHF's list is server "i" to the coordinator (host.py)
        self.batch = batch = _Batch(self, list(self.hooks.rollout_servers(devices)), devices, step)
        prompt_tokens = sum(len(self.tokenizer(text=p, add_special_tokens=False)["input_ids"]) for p in prompts)
        if self.training_gen:
            self._stage_event("jigsaw_stage_start", "gen", devices, len(prompts) * n_samples, prompt_tokens * n_samples)

        def launch(prompt, label, image):
            self._seq += 1
            keys = [f"s{step}-p{self._seq}-n{j}" for j in range(n_samples)]
            return asyncio.ensure_future(asyncio.gather(*[
                self.executor.execute(prompt=prompt, label=label, sampling_params=sampling_params,
                                      max_length=max_length, hf_tokenizer=self.tokenizer,
                                      llm_engine=_RoutedLLM(self, batch, key), images=image)
                for key in keys]))

        pending = {launch(p, lab, img) for p, lab, img in zip(prompts, labels, images or [None] * len(prompts))}
        prompts_consumed = len(prompts)
        controller = asyncio.ensure_future(self._control(batch))
        accepted = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    experiences = [self._process_response_into_experience(r, **kw) for r in task.result()]
                    # Dynamic filtering exactly as SamplesGenerator._generate_vllm (samples_generator.py:166-191).
                    if dynamic_filtering and all(e.scores is not None for e in experiences):
                        scores = [e.scores[0].item() for e in experiences]
                        lo, hi = self.args.algo.dynamic_filtering_range
                        if not (lo < sum(scores) / len(scores) < hi):
                            experiences = []
                    if experiences:
                        accepted.extend(experiences)
                    elif dynamic_filtering:
                        more_p, more_l, more_i, exhausted = _collect_prompt_batch(dataloader_iter, 1)
                        prompts_consumed += len(more_p)
                        pending |= {launch(p, lab, img) for p, lab, img in zip(more_p, more_l, more_i)}
        finally:
            controller.cancel()
            await asyncio.gather(controller, return_exceptions=True)
            generated = sum(len(s.tokens) for s in batch.table.values())
            if self.training_gen:
                if batch.reward_started:
                    self._stage_event("jigsaw_stage_end", "reward", (), len(accepted), 0)
                self._stage_event("jigsaw_stage_end", "gen", devices, len(batch.table), generated)
            # the engines still on; under a policy this ends the rollout's grant
            self.hooks.release([batch.devices[i] for i in batch.router.replicas()], step=step, stage="gen",
                               tokens=generated)
            if self.hooks.client is not None:
                self.hooks.client.flush()  # this batch's events reach the coordinator before it returns
            self.stats["requests"] += len(batch.table)
            self.stats["segments"] += sum(s.segments for s in batch.table.values())
            self.batch = None
        return accepted, prompts_consumed, exhausted

    # ---- tail control -------------------------------------------------------------------
    async def _control(self, batch: _Batch) -> None:
        """Poll progress; carry out the coordinator policy's moves, or under policy
        ``jigsaw`` alone consolidate the long tail (module docstring)."""
        migration, router = self.migration, batch.router
        moves = PolicyMoves(router, lambda engine: self._engine_emptied(batch, engine)) if self.follow_policy else None
        while True:
            await asyncio.sleep(migration.poll_interval_s)
            busy = {i: router.load(i) for i in router.replicas() if router.load(i) > 0}
            progress = {}
            for i in busy:
                progress.update(await router.engine(i).progress())
            self._report_progress(batch, progress)
            if moves is not None:
                await self._follow_policy(moves)
            elif self.settings.get("policy") == "jigsaw":
                await self._tail_rule(batch, busy, progress)

    def _report_progress(self, batch: _Batch, progress: dict) -> None:
        """``jigsaw_request_progress`` per running request, at most every ``PROGRESS_REPORT_S``."""
        now = time.monotonic()
        for seg, n in progress.items():
            rid = seg.rsplit("#", 1)[0]
            state = batch.table.get(rid)
            if state is not None and now - self._progress_t.get(rid, 0.0) >= PROGRESS_REPORT_S:
                self._progress_t[rid] = now
                self._request_hook("jigsaw_request_progress", rid, generated_tokens=len(state.tokens) + n)

    async def _follow_policy(self, moves: PolicyMoves) -> None:
        """Take the policy's commands, carry them out, report each outcome, and give back
        the engines the moves emptied. A call cancelled at the rollout's end still finishes
        taking its commands, and reports them dropped (none is lost in between)."""
        take = asyncio.ensure_future(asyncio.to_thread(self.hooks.take_migrations, 0.0))
        try:
            commands = await asyncio.shield(take)
        except asyncio.CancelledError:
            for cmd in await take:
                self._command_outcome(cmd, "dropped", "the rollout ended before it was carried out")
            raise
        if commands:
            outcomes = await moves.carry_out(commands)
            for cmd, out in zip(commands, outcomes):
                self._command_outcome(cmd, "aborted" if out.status == MOVED else "dropped", out.reason)
                # the run's own log: what the policy asked and what this rollout did with it
                print(f"[jigsaw] {self.hooks.pipeline} step {self.clock.step}: policy command {cmd.seq} moves "
                      f"{cmd.request_id} engine {cmd.src_server} -> {cmd.dst_server}: {out.status}"
                      f"{' (' + out.reason + ')' if out.reason else ''}", flush=True)
            self.stats["policy_commands"] += len(commands)
            self.stats["migrations"] += sum(o.status == MOVED for o in outcomes)
        moves.release_emptied()

    def _command_outcome(self, cmd, status: str, reason: str) -> None:
        if status == "dropped":
            self.stats["policy_dropped"] += 1
        self.hooks.migration_outcome(MigrationOutcome(cmd.pipeline, cmd.request_id, cmd.seq, status, reason))

    def _engine_emptied(self, batch: _Batch, engine: int) -> None:
        """The policy moved every request off ``engine`` and it is detached: its device goes
        back now (part of the rollout's grant: ``replica_release``)."""
        self.hooks.release([batch.devices[engine]], step=batch.step, stage="gen")
        self.stats["switched_off"] += 1
        print(f"[jigsaw] {self.hooks.pipeline} step {batch.step}: engine {engine} emptied by the policy's moves, "
              f"switched off, device {batch.devices[engine]} released mid-rollout", flush=True)

    async def _tail_rule(self, batch: _Batch, busy: dict, progress: dict) -> None:
        """The adapter's own consolidation (no coordinator policy): once the step's requests
        in flight fall to ``tail_fraction`` and each has ``migrate_min_tokens`` tokens, drain
        every other busy engine into the busiest one."""
        migration, router = self.migration, batch.router
        inflight = sum(busy.values())
        if len(busy) < 2 or inflight > migration.tail_fraction * len(batch.table):
            return
        running = [r for i in busy for r in router.records_on(i)]
        if any(progress.get(f"{r.request_id}#{r.segments}", 0) < migration.migrate_min_tokens for r in running):
            return  # let every tail request produce a prefix first
        target = max(busy, key=lambda i: (busy[i], -i))
        # drain_to moves each request once and returns when all run on the target; the
        # rest of the tail then needs no more consolidation (one engine left busy).
        await asyncio.gather(*(self._switch_off(batch, i, target)
                               for i in router.live_replicas() if i != target))

    async def _switch_off(self, batch: _Batch, replica: int, target: int) -> None:
        """Move the engine's requests to ``target``, detach it, release its device. The
        release follows the detach with no await between: a cancelled drain leaves the
        engine attached, and ``_generate`` releases it with the others."""
        try:
            moved = await batch.router.drain_to(replica, target)
        except RouterError:
            return  # the target died meanwhile (checked before anything moved): this engine stays on
        # under a policy: part of the rollout's grant, which the coordinator can grant at once
        self.hooks.release([batch.devices[replica]], step=batch.step, stage="gen")
        self.stats["switched_off"] += 1
        self.stats["migrations"] += moved

    # ---- hooks --------------------------------------------------------------------------
    def _stage_event(self, hook, stage, devices, samples, tokens):
        getattr(self.hooks.emit, hook)(pipeline=self.hooks.pipeline, step=self.clock.step, stage=stage,
                                       devices=tuple(devices), samples=int(samples), tokens=int(tokens),
                                       t=self.hooks.now())

    def _request_hook(self, hook, rid, **kw):
        getattr(self.hooks.emit, hook)(pipeline=self.hooks.pipeline, step=self.clock.step, request_id=rid,
                                       t=self.hooks.now(), **kw)

    def _on_submit(self, rid, replica, prompt_tokens, max_tokens):
        state = self.batch.table[rid] if self.batch else None
        by = self.stats["by_engine"]
        by[replica] = by.get(replica, 0) + 1
        self._request_hook("jigsaw_request_submitted", rid, turn=state.turn if state else 0, replica=replica,
                           prompt_tokens=prompt_tokens, max_tokens=max_tokens)

    def _on_abort(self, rid, replica, generated):
        """A segment ended aborted (only migrations abort here): report it, with everything
        this turn generated so far."""
        if self.batch is None:
            return
        state = self.batch.table[rid]
        self._request_hook("jigsaw_request_aborted", rid, turn=state.turn, replica=replica,
                           generated_tokens=len(state.tokens), reason="migrate")

    def _on_router_event(self, name, **kw):
        """The router's ``migrated`` (its token count is the prefix the request resumes
        with, from the aborted segment's result); ``finished`` is reported by
        ``_RoutedLLM`` with the turn's tokens."""
        if name != "migrated" or self.batch is None:
            return
        state = self.batch.table[kw["request_id"]]
        self._request_hook("jigsaw_request_migrated", kw["request_id"], turn=state.turn, src_replica=kw["src_replica"],
                           dst_replica=kw["dst_replica"], generated_tokens=kw["generated_tokens"])

    def jigsaw_stats(self) -> dict:
        return {**self.stats, "time": time.time()}
