"""`--backend ray`: the same work units, run by Ray actors, for tuning across machines.

Each actor holds one GPU (``num_gpus=1``; Ray sets its ``CUDA_VISIBLE_DEVICES``)
and runs its units through a one-device `WorkerPool`, so a candidate that
crashes or hangs kills a worker process inside the actor, never the actor,
and is recorded exactly as in a local run. Outcomes come back per unit, so a
killed run loses at most the units in flight.

There is no parallel compile pass here (Triton's cache is per machine); each
actor compiles as it measures. Ray is an optional extra (``pip install -e ".[ray]"`` in the checkout) and imported only here.
`address` is passed to ``ray.init`` (None: start or join a local instance).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from moetune.errors import TuneError
from moetune.tune.measure.timing import Outcome
from moetune.tune.measure.worker import (
    DEFAULT_TIMEOUT_S,
    FollowUp,
    WorkerPool,
    WorkUnit,
    raise_if_environment,
)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise TuneError(
            "--backend ray needs Ray: pip install -e '.[ray]' in the moetune checkout, or pip "
            "install ray (or use --backend local)"
        ) from None
    return ray


class _PoolActor:
    """Body of the Ray actor: a one-device worker pool that lives as long as the actor."""

    def __init__(self, timeout_s: float) -> None:
        self.pool = WorkerPool([None], timeout_s=timeout_s)

    def run(self, unit: WorkUnit) -> list[Outcome]:
        return [outcome for _, outcome in self.pool.run([unit])]

    def ceilings(self) -> Any:
        return self.pool.measure_ceilings()

    def close(self) -> None:
        self.pool.close()


class RayBackend:
    """A `Backend` whose workers are Ray actors, one per GPU (or `num_actors` on CPUs)."""

    def __init__(
        self,
        *,
        num_gpus: int = 0,
        num_actors: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        address: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        ray = _import_ray()
        self.ray = ray
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            ray.init(address=address, **(init_kwargs or {}))
        cluster_gpus = int(ray.cluster_resources().get("GPU", 0))
        use_gpus = num_gpus or cluster_gpus
        count = num_actors or max(1, use_gpus)
        actor = ray.remote(num_gpus=1 if use_gpus else 0, num_cpus=1)(_PoolActor)
        self.actors = [actor.remote(timeout_s) for _ in range(count)]

    @property
    def compile_workers(self) -> int:
        # No parallel warm pass: a warmer on one machine would fill another machine's cache.
        return 0

    @property
    def parallelism(self) -> int:
        return len(self.actors)

    def run(
        self, units: Iterable[WorkUnit], then: FollowUp | None = None
    ) -> Iterator[tuple[WorkUnit, Outcome]]:
        queue = deque(units)
        idle = deque(self.actors)
        running: dict[Any, tuple[Any, WorkUnit]] = {}
        while queue or running:
            while queue and idle:
                actor, unit = idle.popleft(), queue.popleft()
                running[actor.run.remote(unit)] = (actor, unit)
            ready, _ = self.ray.wait(list(running), num_returns=1)
            for ref in ready:
                actor, unit = running.pop(ref)
                idle.append(actor)
                outcomes = self.ray.get(ref)
                for outcome in outcomes:
                    yield unit, outcome
                    raise_if_environment(outcome)
                if then is not None:
                    queue.extend(then(unit, outcomes))

    def measure_ceilings(self) -> Any:
        return self.ray.get(self.actors[0].ceilings.remote())

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.get(actor.close.remote())
            except Exception:  # noqa: BLE001 - the actor may already be gone
                pass
            self.ray.kill(actor)
        self.actors = []
        if self.started_ray:
            self.ray.shutdown()
