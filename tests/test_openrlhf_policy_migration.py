"""OpenRLHF under a coordinator policy that chooses migrations: the run declares
``migration`` with its engines as servers (``host.py``), its request events become the rows
the policy sees (``HostExecutor``), the policy's ``Migrate`` comes back as ``HostMigration``
commands, and the rollout controller's ``PolicyMoves`` carries them out on jigsaw's real
``Router`` (abort + resume with the prefix), giving the emptied engine's device back
mid-rollout. No Ray, no vLLM: emulated engines, and a labelled stand-in for the adapter's
``RolloutEngine`` wrapper (which needs Ray) that reports submits and aborts the same way."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

from jigsaw_plugin.adapters.openrlhf.host import engine_servers, moves_requests, openrlhf_host_pipeline
from jigsaw_plugin.adapters.openrlhf.policy_moves import MOVED, PolicyMoves
from jigsaw_plugin.runtime.emulated import EmulatedEngine, RequestAborted, next_token
from jigsaw_plugin.runtime.host_executor import HostExecutor
from jigsaw_plugin.runtime.router import Router
from jigsaw_plugin.scheduler.base import Policy, get_policy, register_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, RetireReplica, RunStage, StartGen

ORL = "orl"
#: each request's budget: q3 ends first, so q1 is left alone on engine 1 beside two on engine 0
BUDGETS = {"q0": 200, "q1": 200, "q2": 200, "q3": 12}


def orl_args():
    """OpenRLHF 0.11.2's parsed arguments, the fields host.py reads."""
    return NS(train=NS(async_enable=False), vllm=NS(tensor_parallel_size=1), eval=NS(dataset=None),
              algo=NS(advantage=NS(estimator="group_norm")), actor=NS(model_name_or_path="/m/tiny-qwen2-tok"),
              rollout=NS(batch_size=2, n_samples_per_prompt=2, max_new_tokens=200), data=NS(max_len=512))


@register_policy("test-orl-move-tail")
class _MoveTail(Policy):
    """Rollouts on one replica per device, two devices; once: a replica left with one
    request while its sibling runs more is retired and its request moved (test policy)."""

    name = "test-orl-move-tail"
    moved = False

    def decide(self, state):
        free, out = sorted(state.free), []
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring]
            tails = [r for r in live if r.load == 1 and not r.queued]
            others = [r for r in live if r.load > 1]
            if tails and others and not type(self).moved:
                type(self).moved = True
                out += [RetireReplica(tails[0].id), Migrate(tails[0].id, others[0].id)]
            if p.next_stage and free and p.running_stage is None:
                out.append(RunStage(p.name, p.train_next, p.next_stage, (free.pop(0),)))
            elif p.gen_next == p.train_next < p.total_steps and not p.replicas and len(free) >= 2:
                out += [LaunchReplica(p.name, (d,)) for d in free[:2]] + [StartGen(p.name, p.gen_next)]
                free = free[2:]
        return out


class _ReportingEngine:
    """Test stand-in for ``engines.RolloutEngine`` (Ray actor handles cannot exist here):
    one emulated engine that reports each segment's submit and abort as the adapter does."""

    def __init__(self, replica: int, emit):
        self.replica, self.engine, self.emit = replica, EmulatedEngine(time_scale=3.0), emit

    async def generate(self, segment_id, prompt_token_ids, max_tokens, on_progress=None, **kw):
        rid = segment_id.rsplit("#", 1)[0]
        self.emit("jigsaw_request_submitted", rid, replica=self.replica, turn=0,
                  prompt_tokens=len(prompt_token_ids), max_tokens=int(max_tokens))
        try:
            return await self.engine.generate(segment_id, prompt_token_ids, max_tokens, on_progress=on_progress)
        except RequestAborted as e:
            self.emit("jigsaw_request_aborted", rid, replica=self.replica, turn=0, generated_tokens=len(e.tokens),
                      reason="migrate")
            raise

    async def abort(self, segment_id):
        return await self.engine.abort(segment_id)


def test_openrlhf_declares_migration_with_its_engines_as_servers():
    host = openrlhf_host_pipeline(ORL, orl_args(), n_engines=2, n_train=1, active_engines=None, steps=1,
                                  request_migration=moves_requests("jigsaw", 2))
    assert host.capabilities.migration and host.capabilities.replica_release and host.servers == ("0", "1")
    one = openrlhf_host_pipeline(ORL, orl_args(), n_engines=1, n_train=1, active_engines=None, steps=1,
                                 request_migration=moves_requests("jigsaw", 1))
    assert not one.capabilities.migration and one.servers == ()  # nowhere to move a request
    routed = openrlhf_host_pipeline(ORL, orl_args(), n_engines=2, n_train=1, active_engines=None, steps=1,
                                    request_migration=moves_requests("least-in-flight", 2))
    assert not routed.capabilities.migration and not routed.capabilities.replica_release
    assert engine_servers(3) == ("0", "1", "2")


def test_a_policy_chosen_move_is_carried_out_and_the_emptied_engine_goes_back_mid_rollout():
    _MoveTail.moved = False
    host = openrlhf_host_pipeline(ORL, orl_args(), n_engines=2, n_train=1, active_engines=None, steps=1,
                                  request_migration=True)
    log: list = []
    ex = HostExecutor(2, host, get_policy("test-orl-move-tail"), on_migration=log.append)

    async def main():
        tk = ex.want(ORL, 0, "gen")
        ex.round()
        assert tk.granted == (0, 1) and [r.server for r in ex.pipelines[ORL].replicas] == ["0", "1"]
        devices = dict(zip((0, 1), tk.granted))  # engine i on the i-th granted device (hooks.rollout_servers)
        events: list = []

        def emit(hook, rid, **kw):  # the adapter's request hooks, as they reach the coordinator
            kw = {"pipeline": ORL, "step": 0, "request_id": rid, "t": 0.0, **kw}
            events.append((hook, kw))
            ex.request_event(hook, kw)
            ex.round()

        def on_router(name, **kw):  # rollout.py's _on_router_event: the router's count is the prefix
            if name == "migrated":
                emit("jigsaw_request_migrated", kw["request_id"], turn=0, src_replica=kw["src_replica"],
                     dst_replica=kw["dst_replica"], generated_tokens=kw["generated_tokens"])

        router = Router({i: _ReportingEngine(i, emit) for i in (0, 1)}, on_event=on_router)
        released: list = []

        def release(engine):  # rollout.py's _engine_emptied: part of the grant back, mid-rollout
            released.append(ex.release_replicas(ORL, 0, [devices[engine]]))

        moves = PolicyMoves(router, release)

        async def request(rid):
            out = await router.generate(rid, [int(rid[1]) + 1, 5], BUDGETS[rid])
            emit("jigsaw_request_finished", rid, turn=0, replica=router.trajectory_replica(rid) or 0,
                 generated_tokens=len(out))
            return out

        tasks = {rid: asyncio.ensure_future(request(rid)) for rid in BUDGETS}
        cmds = []
        for _ in range(2000):  # the controller's poll: take the policy's commands
            await asyncio.sleep(0.002)
            cmds = ex.take_migrations(ORL)
            if cmds:
                break
        assert [(c.request_id, c.src_server, c.dst_server) for c in cmds] == [("q1", "1", "0")]
        out = await moves.carry_out(cmds)
        assert [o.status for o in out] == [MOVED]
        while not moves.release_emptied():
            await asyncio.sleep(0.002)
        results = {rid: await t for rid, t in tasks.items()}
        return events, results, released

    events, results, released = asyncio.run(main())
    # every request finished once with its full budget, the moved one resumed with its prefix
    for rid, out in results.items():
        want: list = []
        for _ in range(BUDGETS[rid]):
            want.append(next_token([int(rid[1]) + 1, 5] + want))
        assert out == want, rid
    finished = [kw["request_id"] for hook, kw in events if hook == "jigsaw_request_finished"]
    assert sorted(finished) == ["q0", "q1", "q2", "q3"]
    subs = [kw for hook, kw in events if hook == "jigsaw_request_submitted" and kw["request_id"] == "q1"]
    mig, = [kw for hook, kw in events if hook == "jigsaw_request_migrated"]
    assert (mig["src_replica"], mig["dst_replica"]) == (1, 0) and mig["generated_tokens"] > 0
    assert [s["replica"] for s in subs] == [1, 0]
    assert subs[1]["prompt_tokens"] == subs[0]["prompt_tokens"] + mig["generated_tokens"]
    assert subs[1]["max_tokens"] == subs[0]["max_tokens"] - mig["generated_tokens"]
    # the coordinator: the move issued and done, engine 1's device back before the rollout ended
    assert [r["hook"] for r in log] == ["jigsaw_migration_issued", "jigsaw_migration_done"]
    assert released == [(1,)] and 1 in ex.free and [r.server for r in ex.pipelines[ORL].replicas] == ["0"]
    assert ex.refusals == []
