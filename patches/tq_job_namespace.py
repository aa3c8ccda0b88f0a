"""TransferQueue 0.1.x under verl 0.9.x: one TransferQueue per Ray job, so several verl jobs can share a cluster.

Why: TransferQueue (verl 0.9.1's v1 data plane) registers its controller as a cluster-wide
named actor, ``TransferQueueController`` in namespace ``transfer_queue``, and every process
of a job finds it by that name (``transfer_queue/interface.py:119, 200-202``). A second
``main_ppo`` joining the same Ray cluster (two verl jobs on one jigsaw coordinator's pool)
would connect to the first job's controller and storage, mix its data partitions with the
first job's, and lose them when the first job's ``tq.close()`` kills that controller.
Neither verl nor TransferQueue has a setting for the name or namespace.

What: in ``transfer_queue.interface`` only, the namespace ``transfer_queue`` is read as
``transfer_queue.<ray job id>``: the module's ``ray.get_actor`` and
``TransferQueueController.options`` see the job's own namespace. Every process of a verl job
(driver, TaskRunner, workers, agent loops) belongs to the same Ray job, so a job still finds
its own controller, and only its own. Opt-in: installed where ``JIGSAW_TQ_PER_JOB=1`` (set it
in the environment of the shared Ray cluster and of each driver). Guarded: verl 0.9.x, a
TransferQueue 0.1.x, and the namespace literal still present in the two functions that use it.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import os

from jigsaw_plugin.adapters.verl.version import check_version

__all__ = ["TARGET", "REASON", "ENV", "requested", "job_namespace", "install"]

TARGET = "transfer_queue.interface"
REASON = "TransferQueue's controller is a cluster-wide named actor: two verl jobs on one Ray cluster would share it"
ENV = "JIGSAW_TQ_PER_JOB"
SHARED_NAMESPACE = "transfer_queue"
_SUPPORTED_TQ = ("0.1.",)
_LITERAL = f'namespace="{SHARED_NAMESPACE}"'


def requested() -> bool:
    return os.environ.get(ENV, "").strip() == "1"


def job_namespace(namespace: str | None, job_id: str) -> str | None:
    """``transfer_queue`` -> ``transfer_queue.<job_id>``; any other namespace unchanged."""
    return f"{SHARED_NAMESPACE}.{job_id}" if namespace == SHARED_NAMESPACE else namespace


def _job_id(ray) -> str:
    return ray.get_runtime_context().get_job_id()


class _JobScopedRay:
    """The ``ray`` module as ``transfer_queue.interface`` sees it: ``get_actor`` per job."""

    def __init__(self, ray):
        self._ray = ray

    def __getattr__(self, name):
        return getattr(self._ray, name)

    def get_actor(self, name, namespace=None):
        return self._ray.get_actor(name, namespace=job_namespace(namespace, _job_id(self._ray)))


class _JobScopedActorClass:
    """``TransferQueueController`` whose ``.options(namespace=...)`` is per job."""

    def __init__(self, actor_class, ray):
        self._cls = actor_class
        self._ray = ray

    def __getattr__(self, name):
        return getattr(self._cls, name)

    def options(self, **kwargs):
        if "namespace" in kwargs:
            kwargs["namespace"] = job_namespace(kwargs["namespace"], _job_id(self._ray))
        return self._cls.options(**kwargs)


def install(module, verl_version: str | None) -> bool:
    """Scope ``module``'s TransferQueue namespace to the Ray job; ``False`` if already done."""
    check_version(verl_version, what="jigsaw patch of transfer_queue.interface")
    if isinstance(module.ray, _JobScopedRay):
        return False
    tq_version = md.version("TransferQueue")
    if not tq_version.startswith(_SUPPORTED_TQ):
        raise RuntimeError(f"jigsaw patch of {TARGET}: TransferQueue {tq_version!r} is not 0.1.x")
    for fn in (module._init_from_existing, module.init):
        if _LITERAL not in inspect.getsource(fn):
            raise RuntimeError(f"jigsaw patch of {TARGET}: {fn.__name__} no longer names {_LITERAL}; "
                               f"this TransferQueue differs from 0.1.11")
    ray = module.ray
    module.ray = _JobScopedRay(ray)
    module.TransferQueueController = _JobScopedActorClass(module.TransferQueueController, ray)
    return True
