"""Migration of a host's requests chosen by the coordinator's policy (hand-driven, no Ray).

A host declaring ``migration`` names its servers; its request events become the rows the
policy sees; the policy's ``Migrate`` becomes ``HostMigration`` commands the host takes; its
aborted + migrated events move the row; nothing is lost or duplicated; a command for a
finished request is dropped with an event; a host without the capability is refused."""

from __future__ import annotations

import asyncio

import pytest

from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.manager import get_plugin_manager
from jigsaw_plugin.runtime.capabilities import HostCapabilities
from jigsaw_plugin.runtime.host_executor import HostExecutor, HostPipeline
from jigsaw_plugin.runtime.host_requests import HostMigration, MigrationOutcome
from jigsaw_plugin.runtime.lease_schedulers import CoordinatorConfig, make_scheduler
from jigsaw_plugin.scheduler.base import Policy, get_policy, register_policy
from jigsaw_plugin.scheduler.decisions import LaunchReplica, Migrate, RetireReplica, RunStage, StartGen

SERVERS = ("10.0.0.1:8000", "10.0.0.1:8001")


def mig(name: str = "m", max_len: int = 32, prompt: int = 16) -> HostPipeline:
    """A verl job with two rollout servers and the jigsaw balancer, as its adapter declares it."""
    return HostPipeline(name, "tiny-qwen2", "grpo", 2, 2, max_len, prompt, 1, 2,
                        HostCapabilities("verl", rollout_replicas=2, migration=True, training_width=2),
                        servers=SERVERS)


def plain(name: str = "o") -> HostPipeline:
    return HostPipeline(name, "tiny-qwen2", "grpo", 2, 2, 32, 16, 1, 1, HostCapabilities("verl", training_width=1))


@register_policy("test-move-tail")
class _MoveTail(Policy):
    """Rollouts on the lowest free devices (one replica per device, as many as the host has
    servers); training on its gang's width; and once: a replica left with exactly one
    request while a sibling still runs some is retired and its request moved there (test
    policy: it records the request views it chose from)."""

    name = "test-move-tail"
    seen: list = []

    def decide(self, state):
        free, out = sorted(state.free), []
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring]
            tails = [r for r in live if r.load == 1 and not r.queued]
            others = [r for r in live if r.load and r not in tails]
            if tails and others and not type(self).seen:
                src, dst = tails[0], others[0]
                type(self).seen = [(v.id, v.generated, v.max_tokens, v.queued, v.predicted_remaining)
                                   for v in src.requests]
                out += [RetireReplica(src.id), Migrate(src.id, dst.id)]
            width = 2 if p.name == "m" else 1
            if p.next_stage and len(free) >= width and p.running_stage is None:
                out.append(RunStage(p.name, p.train_next, p.next_stage, tuple(free[:width])))
                free = free[width:]
            elif p.gen_next == p.train_next < p.total_steps and not p.replicas and len(free) >= width:
                out += [LaunchReplica(p.name, (d,)) for d in free[:width]] + [StartGen(p.name, p.gen_next)]
                free = free[width:]
        return out


def submitted(rid, server, prompt=16, max_tokens=32, step=0):
    return ("jigsaw_request_submitted", dict(pipeline="m", step=step, request_id=rid, turn=0, replica=server,
                                             prompt_tokens=prompt, max_tokens=max_tokens, t=0.0))


def finished(rid, server, n, step=0):
    return ("jigsaw_request_finished", dict(pipeline="m", step=step, request_id=rid, turn=0, replica=server,
                                            generated_tokens=n, t=0.0))


def migrated(rid, src, dst, n, step=0):
    """What the jigsaw balancer emits when it carried a migration out (abort, then the move)."""
    return [("jigsaw_request_aborted", dict(pipeline="m", step=step, request_id=rid, turn=0, replica=src,
                                            generated_tokens=n, reason="migrate", t=0.0)),
            ("jigsaw_request_migrated", dict(pipeline="m", step=step, request_id=rid, turn=0, src_replica=src,
                                             dst_replica=dst, generated_tokens=n, t=0.0))]


def rows(ex) -> dict:
    """request id -> (server of the replica showing it, tokens so far, queued), over every replica."""
    out = {}
    for rep in ex.pipelines["m"].replicas:
        for row in rep.request_rows(ex.t):
            assert row[0] not in out, f"{row[0]} shown twice"
            out[row[0]] = (rep.server, row[4], row[7])
    return out


@pytest.fixture
def ex():
    _MoveTail.seen = []
    log: list = []
    ex = HostExecutor(3, mig(), get_policy("test-move-tail"), on_migration=log.append)
    ex.add(plain())
    ex.log = log
    return ex


def feed(ex, *events):
    for hook, kw in events:
        assert ex.request_event(hook, kw)
    ex.round()


def open_rollout(ex):
    tk = ex.want("m", 0, "gen")
    ex.round()
    assert tk.granted == (0, 1)
    assert [r.server for r in ex.pipelines["m"].replicas] == list(SERVERS)  # bound in order
    a, b = SERVERS
    feed(ex, submitted("q0", a), submitted("q1", a), submitted("q2", b), submitted("q3", b))
    return a, b


def test_policy_sees_rows_moves_a_tail_and_the_row_follows_the_host(ex):
    a, b = open_rollout(ex)
    assert {str(k): v[0] for k, v in rows(ex).items()} == {"m/0/0/0": a, "m/0/1/0": a, "m/0/2/0": b, "m/0/3/0": b}
    # which server the policy put on which granted device (a host placing servers reads it)
    bound = ex.rollout_servers("m")
    assert bound == {d: r.server for r in ex.pipelines["m"].replicas for d in r.devices} and set(bound.values()) == {a, b}
    other = ex.want("o", 0, "gen")
    ex.round()
    assert other.granted == (2,)  # the third device: nothing to move yet
    feed(ex, finished("q3", b, 20))
    assert ex.pipelines["m"].history.count == 1  # the predictor learns real lengths
    # the policy saw q2 alone on b, with what the host reported (0 tokens so far, its budget)
    # and a predicted remaining, never a final length
    (rid, gen, budget, queued, pred), = _MoveTail.seen
    assert (str(rid), gen, budget, queued) == ("m/0/2/0", 0, 32, False) and 0 < pred <= 32
    cmds = ex.take_migrations("m")
    assert cmds == [HostMigration("m", "q2", b, a, 1, cmds[0].issued_t)]
    assert ex.take_migrations("m") == []  # handed out once
    assert [r.server for r in ex.pipelines["m"].replicas] == [a]  # the retired replica closed...
    assert 1 in ex.free  # ...and its device is free for the policy at once
    assert rows(ex)[next(k for k in rows(ex) if k.sample == 2)] == (a, 0, True)  # shown on a, to resume
    feed(ex, *migrated("q2", b, a, 7))
    feed(ex, submitted("q2", a, prompt=23, max_tokens=25))  # the resumed attempt, on a
    now = {k.sample: v for k, v in rows(ex).items()}
    assert now == {0: (a, 0, False), 1: (a, 0, False), 2: (a, 7, False)}  # moved, tokens kept, one row each
    hooks = [r["hook"] for r in ex.log]
    assert hooks == ["jigsaw_migration_issued", "jigsaw_migration_done"]
    assert ex.log[0]["request_id"] == "q2" and ex.log[1]["dst_server"] == a and ex.log[1]["generated_tokens"] == 7
    # request hooks carry the turn's total across attempts (hookspecs.py): 7 kept + 3 new
    feed(ex, ("jigsaw_request_progress", dict(pipeline="m", step=0, request_id="q2", generated_tokens=10, t=0.0)))
    assert {k.sample: v for k, v in rows(ex).items()}[2] == (a, 10, False)
    feed(ex, finished("q2", a, 16), finished("q0", a, 12), finished("q1", a, 30))
    assert rows(ex) == {} and ex.pipelines["m"].history.count == 4
    ex.done("m", 0, "gen", tokens=78)
    assert ex.books["m"].issued == {} and ex.refusals == []


def test_a_command_for_a_finished_request_is_dropped_with_an_event(ex):
    a, b = open_rollout(ex)
    feed(ex, finished("q3", b, 20))  # the policy issues q2's move
    assert ex.log[-1]["hook"] == "jigsaw_migration_issued"
    feed(ex, finished("q2", b, 4))  # it finished before the host took the command
    assert ex.take_migrations("m") == []
    assert ex.log[-1]["hook"] == "jigsaw_migration_dropped" and ex.log[-1]["request_id"] == "q2"
    assert "finished" in ex.log[-1]["reason"]


def test_the_hosts_dropped_outcome_is_logged_and_never_an_error(ex):
    a, b = open_rollout(ex)
    feed(ex, finished("q3", b, 20))
    cmd, = ex.take_migrations("m")
    feed(ex, finished("q2", b, 4))  # finished after the host took it: the host drops it
    ex.migration_outcome(MigrationOutcome("m", "q2", cmd.seq, "dropped", "not running"))
    assert ex.log[-1]["hook"] == "jigsaw_migration_dropped" and ex.log[-1]["reason"] == "not running"
    ex.migration_outcome(MigrationOutcome("m", "q9", 99, "dropped"))  # unknown: ignored
    assert {k.sample for k in rows(ex)} == {0, 1}


def test_a_host_without_migration_is_refused_with_the_reason():
    ex = HostExecutor(2, plain("v"), get_policy("test-move-tail"))
    ex.want("v", 0, "gen")
    ex.round()
    rep = ex.pipelines["v"].replicas[0]
    ex.apply(Migrate(rep.id, rep.id))
    assert "cannot migrate requests (migration=false)" in ex.refusals[-1]["reason"]
    assert not ex.request_event(*submitted("x", "s"))  # its request events are not rows


def test_bad_declarations_and_commands_name_the_field():
    with pytest.raises(SpecError, match="servers"):
        HostPipeline("m", "tiny-qwen2", "grpo", 2, 2, 32, 16, 1, 2,
                     HostCapabilities("verl", rollout_replicas=2, migration=True, training_width=2))
    with pytest.raises(SpecError, match="servers"):
        HostPipeline("m", "tiny-qwen2", "grpo", 2, 2, 32, 16, 1, 2, HostCapabilities("verl"), servers=("a", "a"))
    assert HostPipeline.from_dict(mig().to_dict()) == mig()
    cmd = HostMigration("m", "q", "a", "b", 1, 0.5)
    assert HostMigration.from_dict(cmd.to_dict()) == cmd
    with pytest.raises(SpecError, match="migration.dst_server"):
        HostMigration("m", "q", "a", "a", 1, 0.5)
    with pytest.raises(SpecError, match="migration.color"):
        HostMigration.from_dict({**cmd.to_dict(), "color": 1})
    with pytest.raises(SpecError, match="migration_outcome.status"):
        MigrationOutcome.from_dict({"pipeline": "m", "request_id": "q", "seq": 1, "status": "lost"})


def test_the_coordinators_scheduler_feeds_rows_and_long_polls_commands():
    async def main():
        _MoveTail.seen = []
        log: list = []
        s = make_scheduler(CoordinatorConfig(3, "test-move-tail"),
                           get_plugin_manager(load_entrypoints=False, default_plugins=False), log.append)
        s.register("m", mig())
        got = await s.acquire("m", "rollout", 2, 5.0, 0, "gen")
        a, b = SERVERS
        for hook, kw in (submitted("q0", a), submitted("q1", a), submitted("q2", b), submitted("q3", b)):
            s.observe(hook, kw)
        s.observe("jigsaw_stage_end", {"pipeline": "m"})  # not a request event: ignored
        poll = asyncio.ensure_future(s.take_migrations("m", 5.0))
        await asyncio.sleep(0.01)
        assert not poll.done()  # nothing chosen yet: the host's poll waits
        s.observe(*finished("q3", b, 20))
        cmds = await asyncio.wait_for(poll, 1.0)
        fifo = make_scheduler(CoordinatorConfig(1), None, log.append)
        t0 = asyncio.get_running_loop().time()
        none = await fifo.take_migrations("m", 0.05)  # paced: a host's poll loop does not spin
        assert asyncio.get_running_loop().time() - t0 >= 0.04
        return got, cmds, log, none, s.report(), s.rollout_servers("m"), fifo.rollout_servers("m")

    got, cmds, log, fifo, report, bound, fifo_bound = asyncio.run(main())
    assert got == (0, 1) and [HostMigration.from_dict(c).request_id for c in cmds] == ["q2"]
    assert set(bound) <= {0, 1} and set(bound.values()) <= set(SERVERS) and fifo_bound == {}
    assert [e["hook"] for e in log if "migration" in e["hook"]] == ["jigsaw_migration_issued"]
    assert fifo == [] and report["migrations"][0]["request_id"] == "q2"


def test_the_jigsaw_policy_moves_nothing_until_the_steps_requests_are_all_submitted():
    """Requests the host has yet to submit count as queued on its servers: the jigsaw policy
    neither consolidates nor retires on rows still arriving; once they are all in, it chooses
    from them (here: it consolidates the two-server rollout onto one server)."""
    log: list = []
    ex = HostExecutor(3, mig(max_len=256, prompt=64), get_policy("jigsaw"), on_migration=log.append)
    ex.add(plain())
    tk = ex.want("m", 0, "gen")
    ex.round()
    assert tk.granted == (0, 1)
    a, b = SERVERS
    feed(ex, submitted("q0", a), submitted("q1", b), submitted("q2", a))
    assert log == [] and len(ex.pipelines["m"].replicas) == 2
    feed(ex, submitted("q3", b))
    issued = [r for r in log if r["hook"] == "jigsaw_migration_issued"]
    assert issued and {r["src_server"] for r in issued} | {r["dst_server"] for r in issued} == {a, b}
    moved = {r["request_id"] for r in issued}
    assert len(moved) == len(issued) == 2 and len(rows(ex)) == 4  # each request once, none lost


@register_policy("test-spread-once")
class _SpreadOnce(Policy):
    """A replica on the lowest free device opens the rollout; once a replica shows four
    requests (the host's rows) and a device is free, a replica launched there with ``spread`` takes its
    share of them (test policy)."""

    name = "test-spread-once"
    spread: list = []

    def decide(self, state):
        free, out = sorted(state.free), []
        for p in state.order:
            live = [r for r in p.replicas if not r.retiring]
            if p.gen_next == p.train_next < p.total_steps and not p.replicas and free:
                out += [LaunchReplica(p.name, (free[0],)), StartGen(p.name, p.gen_next)]
                free = free[1:]
            elif p.generating and any(len(r.requests) >= 4 for r in live) and free and not type(self).spread:
                type(self).spread = [LaunchReplica(p.name, (free[0],), spread=True)]
                out += type(self).spread
        return out


def test_a_spread_replica_takes_half_the_requests_by_host_migration():
    # all four requests on the first server; the host's next server opens on a free
    # device, and the new replica takes requests from the loaded one until it holds the
    # average (4 over 2 replicas: 2): two HostMigration commands from the first server to it
    _SpreadOnce.spread = []
    servers = SERVERS + ("10.0.0.1:8002",)
    host = HostPipeline("m", "tiny-qwen2", "grpo", 2, 2, 32, 16, 1, 2,
                        HostCapabilities("verl", rollout_replicas=3, migration=True, replicas_elastic=True,
                                         training_width=2), servers=servers)
    ex = HostExecutor(3, host, get_policy("test-spread-once"))
    tk = ex.want("m", 0, "gen")
    ex.round()
    assert tk.granted == (0,)
    a = ex.pipelines["m"].replicas[0].server
    feed(ex, *(submitted(f"q{i}", a) for i in range(4)))
    assert _SpreadOnce.spread and ex.refusals == []
    cmds = ex.take_migrations("m")
    new = [r for r in ex.pipelines["m"].replicas if r.devices == (1,)]
    assert len(new) == 1 and new[0].server != a
    assert [(c.src_server, c.dst_server) for c in cmds] == [(a, new[0].server)] * 2
    shown = rows(ex)
    assert len(shown) == 4  # nothing lost or shown twice
    assert [v[0] for v in shown.values()].count(new[0].server) == 2  # shown on the new replica, to resume
