"""Weight dissemination (runtime/dissemination, costmodel/dissemination): every strategy
delivers bit-identical weights, the chain relays in order, pull never serves a stale
version, the closed forms have the measured shape, and bad arguments name their field."""

from __future__ import annotations

import numpy as np
import pytest

from jigsaw_plugin.costmodel.dissemination import CPU_HOP, HopCost, dissemination_price, fit_hop, gpu_hop
from jigsaw_plugin.errors import SpecError
from jigsaw_plugin.runtime.dissemination import (
    STRATEGIES,
    DisseminationSpec,
    LinkSpec,
    pack_state,
    pack_synthetic,
    state_checksum,
    synthetic_state,
    unpack_state,
)

MB = 1024 * 1024


def _mixed_state(seed: int) -> dict:
    """Several dtypes and shapes, a 0-d tensor included, like a real state dict."""
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "layers.0.attn.bias": rng.standard_normal(7).astype(np.float16),
        "layers.0.mlp.weight": rng.standard_normal((96, 33)),  # float64
        "step": np.array(seed, dtype=np.int64),
        "mask": rng.integers(0, 2, (5, 5)).astype(np.bool_),
    }


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        if type(a[k]).__module__.startswith("torch"):
            import torch

            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k


# --- no Ray needed --------------------------------------------------------------------

def test_pack_unpack_is_bit_exact_and_checksum_sees_every_byte():
    state = _mixed_state(3)
    layout, buf = pack_state(state)
    back = unpack_state(layout, buf)
    _same(state, back)
    assert state_checksum(back) == state_checksum(state)
    buf[layout.slots[2].offset] ^= 1  # one flipped bit in one tensor
    assert state_checksum(unpack_state(layout, buf)) != state_checksum(state)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_pack_synthetic_is_pack_state_of_synthetic_state_bit_for_bit(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    for total, tensor in ((1000, 64), (3 * 4096 + 8, 4096), (40, 4)):
        layout, buffer = pack_state(synthetic_state(total, 3, tensor, backend))
        direct = pack_synthetic(total, 3, tensor, backend)
        assert direct[0] == layout and np.array_equal(direct[1], buffer)
    with pytest.raises(SpecError, match="total_bytes"):
        pack_synthetic(2)


def test_bad_arguments_name_their_field():
    cases = [
        (lambda: LinkSpec(bandwidth_bytes_s=-1.0), "link.bandwidth_bytes_s"),
        (lambda: LinkSpec(bandwidth_bytes_s=1e9, latency_s=-0.1), "link.latency_s"),
        (lambda: LinkSpec.from_gbit_s(0), "link.gbit_s"),
        (lambda: DisseminationSpec("broadcast-all"), "strategy"),
        (lambda: DisseminationSpec("chain", chunk_bytes=0), "chunk_bytes"),
        (lambda: DisseminationSpec("chain", link="1Gbps"), "link"),
        (lambda: dissemination_price(DisseminationSpec("naive"), 10, 0), "replicas"),
        (lambda: dissemination_price(DisseminationSpec("naive"), -5, 1), "total_bytes"),
        (lambda: HopCost(overhead_s=0.0, bytes_per_s=-1.0), "hop.bytes_per_s"),
        (lambda: gpu_hop(scope="pcie"), "scope"),
        (lambda: synthetic_state(1 * MB, backend="jax"), "backend"),
        (lambda: pack_state({}), "state"),
        (lambda: pack_state({"w": [1.0, 2.0]}), "state['w']"),
    ]
    for make, field in cases:
        with pytest.raises(SpecError) as e:
            make()
        assert e.value.field == field and "allowed" in str(e.value)


@pytest.mark.parametrize("link", [None, LinkSpec.from_gbit_s(1.0, 20.0)])
def test_closed_forms_are_monotone_in_size_and_count(link):
    for strategy in STRATEGIES:
        spec = DisseminationSpec(strategy, chunk_bytes=8 * MB, link=link)
        by_size = [dissemination_price(spec, s * MB, 4).seconds for s in (8, 64, 512, 2048)]
        by_count = [dissemination_price(spec, 256 * MB, n).seconds for n in (1, 2, 4, 8, 16)]
        assert by_size == sorted(by_size) and by_size[0] < by_size[-1], strategy
        assert by_count == sorted(by_count), strategy


def test_closed_forms_have_the_papers_shapes():
    link = LinkSpec.from_gbit_s(1.0, 20.0)
    size, chunk = 1024 * MB, 16 * MB

    def price(strategy, n):
        return dissemination_price(DisseminationSpec(strategy, chunk_bytes=chunk, link=link), size, n)

    # naive ~ size x count; chain ~ size + count x chunk
    naive_extra = price("naive", 16).seconds - price("naive", 1).seconds
    chain_extra = price("chain", 16).seconds - price("chain", 1).seconds
    assert naive_extra >= 15 * link.busy_seconds(size)  # every extra replica: the whole state again
    assert chain_extra < 15 * 2 * link.seconds(chunk) + 15 * CPU_HOP.seconds(chunk)
    assert price("chain", 16).seconds < price("naive", 16).seconds / 8
    # the parameter server holds the trainer for one put, whatever the count
    assert price("pull", 1).trainer_seconds == price("pull", 16).trainer_seconds
    assert price("pull", 16).trainer_seconds < price("chain", 16).trainer_seconds
    # the GPU case: same forms, published link speeds
    fast = dissemination_price(DisseminationSpec("chain", chunk_bytes=chunk), size, 16, hop=gpu_hop("h100"))
    assert fast.seconds < 1.0


def test_fit_hop_recovers_overhead_and_bandwidth():
    points = [(m, b, m * 0.01 + b / 2e9) for m, b in [(1, 1e6), (1, 1e8), (16, 1e8), (1, 1e9), (16, 1e9)]]
    hop = fit_hop(points, parallel_hops=2, source="t")
    assert hop.overhead_s == pytest.approx(0.01) and hop.bytes_per_s == pytest.approx(2e9)
    with pytest.raises(SpecError, match="points"):  # one size, one message count: ambiguous
        fit_hop([(1, 1e6, 0.1), (2, 2e6, 0.2)], parallel_hops=2, source="t")


# --- on Ray ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def group():
    ray = pytest.importorskip("ray")
    from jigsaw_plugin.runtime.dissemination import DisseminationGroup

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="test-dissemination")
    g = DisseminationGroup(3)
    yield g
    g.close()
    ray.shutdown()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_delivers_bit_identical_weights(group, strategy):
    import ray

    state = _mixed_state(1)
    group.set_state(state)
    for n in (1, 2, 3):
        # 4 KiB chunks: the chain cuts this ~35 KB state into several chunks
        r = group.run(DisseminationSpec(strategy, chunk_bytes=4096), replicas=n)
        assert r.replicas == n and r.bit_identical, (strategy, n)
        for replica in group.replicas[:n]:
            _same(state, ray.get(replica.state.remote()))


def test_bit_identical_torch_state_with_bfloat16(group):
    torch = pytest.importorskip("torch")
    import ray

    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(33, 17, generator=g).to(torch.bfloat16), "b": torch.randn(9, generator=g),
             "n": torch.tensor(7)}
    group.set_state(state)
    for strategy in STRATEGIES:
        r = group.run(DisseminationSpec(strategy, chunk_bytes=256, link=LinkSpec(1e9, 1e-4)))
        assert r.bit_identical
        for replica in group.replicas:
            _same(state, ray.get(replica.state.remote()))


def test_chain_relays_every_chunk_once_in_chunk_order_down_the_chain(group):
    import ray

    group.set_state(synthetic_state(64 * 1024, seed=2, tensor_bytes=16 * 1024))
    r = group.run(DisseminationSpec("chain", chunk_bytes=8 * 1024, link=LinkSpec(1e9, 1e-3)))
    assert r.chunks == 8 and r.bit_identical
    arrivals = [ray.get(rep.arrivals.remote()) for rep in group.replicas]
    relayed = [ray.get(rep.relayed.remote()) for rep in group.replicas]
    for i, got in enumerate(arrivals):
        assert sorted(a.chunk for a in got) == list(range(8))  # every chunk exactly once
        assert {a.sender for a in got} == {i - 1}  # from its predecessor (-1: the trainer)
    assert relayed[:-1] == [list(range(8))] * 2 and relayed[-1] == []  # sent on in chunk order
    at = [{a.chunk: a.at_s for a in got} for got in arrivals]
    for i in range(1, len(at)):
        for k in range(8):  # a chunk reaches replica i only after replica i-1 had it
            assert at[i][k] >= at[i - 1][k]


def test_pull_serves_the_latest_version_never_a_stale_one(group):
    import ray

    spec = DisseminationSpec("pull")
    states = [_mixed_state(10 + v) for v in range(3)]
    registry = group.registry(None)
    seen = []
    for v, state in enumerate(states):
        group.set_state(state)
        r = group.run(spec, replicas=1 + v % 3)  # a different subset is ready each time
        assert r.bit_identical and len({d.version for d in r.deliveries}) == 1
        seen.append(r.deliveries[0].version)
        assert ray.get(registry.held_versions.remote()) == [seen[-1]]  # older versions released
        # every replica pulling after this push gets it, whatever it held before
        for replica in group.replicas:
            assert ray.get(replica.pull.remote(registry)) == seen[-1]
            assert ray.get(replica.checksum.remote()) == state_checksum(state)
    assert seen == sorted(seen) and len(set(seen)) == 3
    with pytest.raises(ray.exceptions.RayTaskError, match="version"):
        ray.get(registry.publish.remote(seen[0], [], None, ""))
    group.free_published()  # the registry forgets the version; replicas keep what they hold
    assert ray.get(registry.held_versions.remote()) == []
    assert ray.get(group.replicas[0].pull.remote(registry)) == seen[-1]


def test_measured_times_have_the_cost_models_shape(group):
    import ray

    # A slow modelled link (4 MB/s, 2 ms) makes the sleeps dominate, and a sleep is a hard
    # lower bound: each strategy takes at least its link time, and naive > chain as priced.
    # How much faster the chain measures is a benchmark's figure (benchmarks/dissemination.py,
    # docs/benchmarks.md): on a loaded machine its relays wait for a core, so a timed ratio
    # here would test the machine's load. What must hold whatever the load: the chain
    # overlaps its hops (the last replica has the first chunk before the first has the last).
    link = LinkSpec(bandwidth_bytes_s=4e6, latency_s=0.002)
    group.set_state(synthetic_state(MB, seed=4, tensor_bytes=MB // 4))
    priced = {}
    for strategy in ("naive", "chain"):
        spec = DisseminationSpec(strategy, chunk_bytes=MB // 8, link=link)
        r = group.run(spec)
        zero = HopCost(overhead_s=0.0, bytes_per_s=1e30)
        floor = dissemination_price(spec, r.total_bytes, 3, hop=zero).seconds
        assert r.bit_identical and r.seconds >= floor * 0.98, strategy
        priced[strategy] = dissemination_price(spec, r.total_bytes, 3).seconds
    assert priced["naive"] > 1.5 * priced["chain"]
    first, last = ({a.chunk: a.at_s for a in ray.get(rep.arrivals.remote())} for rep in (group.replicas[0],
                                                                                        group.replicas[-1]))
    # one chunk's hop is 1/8 of the 0.25 s the state takes over the link: the last replica
    # gets chunk 0 about two hops after the first, long before the first gets chunk 7
    assert last[0] < first[7], (last, first)
