"""Worker processes that measure candidates, isolated so that no candidate can end a sweep.

A `WorkerPool` runs one *timer* process per GPU (``CUDA_VISIBLE_DEVICES`` set
per process; multiprocessing's spawn context, so no CUDA state is ever forked)
and, optionally, *warmer* processes that compile candidates in parallel: they
run each candidate once, which fills Triton's on-disk cache, so the timer only
loads binaries and the GPU never times one candidate while another is being
compiled on it.

Work travels in `WorkUnit`s (a batch size and a chunk of candidates) and comes
back one `Outcome` per candidate, as soon as it exists. Faults:

- an exception (compile error, ``OutOfResources``, a bad launch) becomes an
  outcome with its status and a one-line error;
- a failure of the machine rather than the config (a missing module, no GPU,
  a driver error; `moetune.tune.environment`) comes back with the status
  ``environment``, and the pool then stops with `WorkerEnvironmentError`:
  every other candidate would fail the same way;
- a CUDA error poisons the process's context: the worker reports it and exits,
  and the pool starts a fresh one;
- a crash (segfault, ``os._exit``, the OOM killer) or a hang (no result within
  `timeout_s`) kills the process; the candidate in flight is recorded as
  ``crashed`` / ``timeout``, a fresh process takes the rest of the unit.

Every `recycle_after` candidates a worker is replaced, so compiled kernels and
CUDA graphs never pile up over thousands of candidates. A worker whose parent
dies (``kill -9``) exits at once, quietly (`moetune.tune.signals.watch_parent`).

``MOETUNE_TEST_FAULTS`` injects faults for tests: ``kind:FIELD=V[,FIELD=V]``
items separated by ``;``, kind one of ``raise``, ``compile`` (a compiler error), ``crash``, ``hang``,
``cuda`` (a simulated CUDA error), ``import`` (a missing module) or ``wrong`` (a verification
gets a wrong output). ``mode=M`` limits an item to units of that mode (``quick``, ``full``, ``warm``...).
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from moetune.device import interpreter_requested
from moetune.errors import TuneError
from moetune.tune.environment import (
    ENVIRONMENT,
    WorkerEnvironmentError,
    is_environment_error,
)
from moetune.tune.measure.timing import Outcome
from moetune.tune.signals import (
    children_ignore_interrupts,
    ignore_interrupts,
    signals_deferred,
    watch_parent,
)

FAULTS_ENV = "MOETUNE_TEST_FAULTS"
MODES = ("quick", "full", "warm", "verify", "confirm")
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_STARTUP_TIMEOUT_S = 600.0
DEFAULT_RECYCLE_AFTER = 1000
# The longest wait the pool accepts (a day); longer ones overflow the OS's timers.
MAX_TIMEOUT_S = 86400.0
# Seed of the inputs a verification draws (timing uses seed 0): fresh data for the check.
VERIFY_SEED = 1234
# Exit code of a worker whose CUDA context is poisoned; the pool restarts it quietly.
POISONED_EXIT = 75
ERROR_CHARS = 500
# A worker killed by SIGHUP/SIGINT/SIGTERM: how long the parent waits for its own signal (poll).
STOP_EXIT_CODES = (-1, -2, -15)
STOP_GRACE_S = 1.0


@dataclass(frozen=True)
class WorkUnit:
    """Measure `candidates` on `problem` at `batch_size`, in `mode`.

    mode: "quick" / "full" (time at that fidelity), "warm" (compile and run
    once), "verify" (compare one output with the PyTorch reference), "confirm" (a
    round of `moetune.tune.confirm`: each candidate timed at "full" fidelity, torch's
    random generators seeded with `seed` before each, so every candidate of the unit
    reads the same routing draws).
    """

    problem: Any  # moetune.tune.problem.TuneProblem
    batch_size: int
    candidates: tuple[Any, ...]  # moetune.kernel.config.Candidate
    mode: str
    seed: int = 0  # "confirm": the round's routing draws


@dataclass(frozen=True)
class Fault:
    kind: str
    match: dict[str, int]
    mode: str | None = None  # only units of this mode

    def hits(self, candidate: Any, mode: str | None = None) -> bool:
        if self.mode is not None and mode != self.mode:
            return False
        return all(getattr(candidate, field) == value for field, value in self.match.items())


def parse_faults(spec: str) -> list[Fault]:
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        kind, _, fields = item.partition(":")
        match, mode = {}, None
        for pair in filter(None, fields.split(",")):
            field, _, value = pair.partition("=")
            if field.strip() == "mode":
                mode = value.strip()
            else:
                match[field.strip()] = int(value)
        faults.append(Fault(kind.strip(), match, mode))
    return faults


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return message[:ERROR_CHARS]


def classify(exc: BaseException) -> str:
    """The measurement status of an exception raised while measuring a candidate."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, ImportError) or is_environment_error(one_line(exc)):
        return ENVIRONMENT
    if "OutOfResources" in names:
        return "out_of_resources"
    if names & {"CompilationError", "PTXASError", "CompileTimeAssertionFailure"}:
        return "compile_error"
    return "runtime_error"


def poisons_context(exc: BaseException) -> bool:
    """Whether the CUDA context is unusable after `exc` (only a new process recovers)."""
    text = str(exc)
    return (
        "CUDA error" in text
        or "illegal memory access" in text
        or "AcceleratorError" in {cls.__name__ for cls in type(exc).__mro__}
    )


def raise_if_environment(outcome: Outcome) -> None:
    """Stop with `WorkerEnvironmentError` when `outcome` failed because of the machine."""
    if outcome.status == ENVIRONMENT:
        raise WorkerEnvironmentError(outcome.error or "an unknown environment error")


class CompilationError(Exception):
    """The injected ``compile`` fault; named like Triton's so it classifies the same."""


# ---------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------


class _Inputs:
    """The current problem's tensors. The expert weights are drawn once per (problem, seed)
    and kept while only the batch size changes (`moetune.kernel.problem.with_tokens`), so a
    worker that moves between batch sizes draws only their tokens.

    `device` is the GPU the worker was given (its ``CUDA_VISIBLE_DEVICES``), None if none.
    """

    def __init__(self, device: str | None = None) -> None:
        self.key: tuple | None = None
        self.value: Any = None
        self.weights_key: tuple | None = None
        self.weights: Any = None  # the problem at one token, whose weights every batch size uses
        self.device = device

    def get(self, problem: Any, batch_size: int, seed: int) -> Any:
        key = (problem, batch_size, seed)
        if key != self.key:
            import torch

            from moetune.kernel.problem import with_tokens

            _check_gpu(torch, self.device)

            self.value = None
            if (problem, seed) != self.weights_key:
                self.weights = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                self.weights = self._weights(torch, problem, seed)
                self.weights_key = (problem, seed)
            self.value = with_tokens(self.weights, batch_size, seed)
            self.key = key
        return self.value

    @staticmethod
    def _weights(torch: Any, problem: Any, seed: int) -> Any:
        from moetune.kernel.problem import make_problem

        value = make_problem(
            1,
            problem.num_experts,
            problem.intermediate_size,
            problem.hidden_size,
            problem.top_k,
            problem.dtype,
            block_shape=problem.block_shape,
            device="cuda" if torch.cuda.is_available() else "cpu",
            seed=seed,
            **problem.kernel_options(),
        )
        if problem.kernel is not None:  # time the engine's own kernel
            from dataclasses import replace

            from moetune.engines.launch import engine_gemm

            value = replace(value, gemm=engine_gemm(problem.kernel))
        return value


def _check_gpu(torch: Any, device: str | None) -> None:
    """Raise an environment error when this worker has no GPU to time on."""
    if torch.cuda.is_available():
        return
    if device is not None:
        raise RuntimeError(
            f"the worker cannot use GPU {device}: with CUDA_VISIBLE_DEVICES={device} "
            "CUDA sees no device"
        )
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "the worker cannot use a GPU: CUDA sees none (and TRITON_INTERPRET=1 is not set)"
        )


def _inject(faults: list[Fault], candidate: Any, mode: str) -> bool:
    """Act out the test faults that hit `candidate`; True if the output must be made wrong."""
    wrong = False
    for fault in faults:
        if not fault.hits(candidate, mode):
            continue
        if fault.kind == "raise":
            raise RuntimeError(f"injected fault for {candidate}")
        if fault.kind == "crash":
            os._exit(11)
        if fault.kind == "hang":
            time.sleep(3600)
        if fault.kind == "compile":
            raise CompilationError(f"injected compile error for {candidate}")
        if fault.kind == "cuda":
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
        if fault.kind == "import":
            raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
        if fault.kind == "wrong" and mode == "verify":
            wrong = True
    return wrong


def _seed_draws(seed: int) -> None:
    """Seed torch's generators (CPU and every GPU's): the routing logits a timing refills
    its graph's buffers with are then the same for every candidate timed after it."""
    import torch

    torch.manual_seed(seed)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _measure(unit: WorkUnit, candidate: Any, inputs: _Inputs, faults: list[Fault]) -> Outcome:
    from moetune.tune.measure.timing import _call, time_fused_moe

    config = candidate.as_config()
    corrupt = _inject(faults, candidate, unit.mode)
    from moetune.tune.measure.probe_timing import measure_probe, uses_probe_timing

    mode = unit.mode
    if mode == "confirm":  # a confirmation round: "full" timing, the round's routing draws
        mode = "full"
        _seed_draws(unit.seed)
    if uses_probe_timing(unit.problem, candidate, mode):  # split probes, real routing
        seed = VERIFY_SEED if mode == "verify" else 0
        data = inputs.get(unit.problem, unit.batch_size, seed)
        return measure_probe(unit.problem, unit.batch_size, mode, candidate, data, corrupt)
    if unit.mode == "verify":
        from moetune.tune.measure.verify import check_output

        data = inputs.get(unit.problem, unit.batch_size, VERIFY_SEED)
        check = check_output(data, config, unit.problem.dtype, corrupt=corrupt)
        return Outcome(
            candidate,
            "ok" if check.ok else "wrong_result",
            error=None if check.ok else check.describe(),
            rel_rms=check.rel_rms,
            max_abs=check.max_abs,
        )
    data = inputs.get(unit.problem, unit.batch_size, 0)
    if unit.mode == "warm":
        start = time.perf_counter()
        _call(data, config, data.router_logits)
        _synchronize()
        return Outcome(candidate, "ok", compile_s=time.perf_counter() - start)
    timing = time_fused_moe(data, config, mode)
    return Outcome(
        candidate, "ok", timing.median_us, timing.p20_us, timing.p80_us, timing.compile_s
    )


def enable_compile_only() -> bool:
    """Make every Triton launch in this process compile (and load) the kernel without running it.

    Used by warmer processes: they fill Triton's on-disk cache, and loading the
    binary still raises ``OutOfResources`` for a config that does not fit, but
    nothing runs on the GPU, so a timing in another process is never disturbed.
    Outputs of launches are then garbage, which a warmer never reads. False
    when Triton is in interpreter mode or its launcher is not the expected one.
    """
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    launch = JITFunction.run

    def compile_and_load(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        load = getattr(kernel, "_init_handles", None)
        if load is not None:
            load()
        return kernel

    JITFunction.run = compile_and_load
    return True


def quiet_interpreter() -> None:
    """Under TRITON_INTERPRET=1, drop numpy's RuntimeWarnings (``overflow encountered in
    multiply``): the interpreter runs a candidate's tiles in numpy, whose padding lanes
    overflow harmlessly, and a wrong result is caught by the check against the reference.
    A compiled kernel raises none of them, so elsewhere they are left alone."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        warnings.filterwarnings("ignore", category=RuntimeWarning)


def worker_main(
    conn: Any, device: str | None, compile_only: bool = False, kill_with_parent: bool = False
) -> None:
    """Entry point of a worker process: measure the units the pool sends, until told to stop.

    It ends quietly when the parent is gone: told to stop, a closed pipe, or the
    parent's death noticed by `watch_parent`.
    """
    watch_parent(kill_with_parent)
    ignore_interrupts()  # Ctrl-C is the parent's to handle (moetune.tune.signals)
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    elif interpreter_requested():  # the interpreter times on the CPU, GPU or not
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if compile_only:
        enable_compile_only()
    quiet_interpreter()
    faults = parse_faults(os.environ.get(FAULTS_ENV, ""))
    inputs = _Inputs(device)
    _prepare()
    try:
        _serve(conn, inputs, faults)
    except (EOFError, OSError):  # the parent closed the pipe or died: nobody to report to
        os._exit(0)


def _prepare() -> None:
    """Load what every unit needs before the first one comes: torch, Triton, the kernels and
    the GPU's CUDA context (about 3 s a process). A pool started before its work is planned
    (`WorkerPool.start`) so does it while the parent plans. A failure here is not reported:
    the first unit meets it again and reports it as its own."""
    try:
        import torch

        import moetune.kernel.fused_moe  # noqa: F401 - Triton and moetune's kernels
        import moetune.tune.measure.timing  # noqa: F401

        if torch.cuda.is_available():
            torch.empty(1, device="cuda")  # the CUDA context
    except Exception:  # noqa: BLE001, S110 - the first unit reports it (docstring)
        pass


def _serve(conn: Any, inputs: _Inputs, faults: list[Fault]) -> None:
    while True:
        message = conn.recv()
        if message is None:
            return
        if message == "ceilings":
            from moetune.tune.measure.timing import measure_ceilings

            try:
                conn.send(("ceilings", measure_ceilings()))
            except Exception as exc:  # noqa: BLE001 - the parent reports it; this worker lives on
                conn.send(("error", one_line(exc)))
            continue
        unit: WorkUnit = message
        for index, candidate in enumerate(unit.candidates):
            conn.send(("start", index))
            poisoned = False
            try:
                outcome = _measure(unit, candidate, inputs, faults)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded outcome
                outcome = Outcome(candidate, classify(exc), error=one_line(exc))
                poisoned = poisons_context(exc)
            conn.send(("result", index, outcome))
            if poisoned:
                conn.close()
                os._exit(POISONED_EXIT)
        conn.send(("done",))


# ---------------------------------------------------------------------------
# The parent side
# ---------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Pids of the processes below `pid`, read from /proc (empty where there is no /proc)."""
    try:
        entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []
    parent: dict[int, int] = {}
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            parent[entry] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found: list[int] = []
    level = {pid}
    while level:
        level = {child for child, ppid in parent.items() if ppid in level}
        found.extend(sorted(level))
    return found


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Job:
    """A unit on its way through the pool: what is left of it and what came back so far."""

    def __init__(self, unit: WorkUnit) -> None:
        self.origin = unit
        self.unit = unit
        self.outcomes: list[Outcome] = []

    @property
    def finished(self) -> bool:
        return len(self.outcomes) == len(self.origin.candidates)


class _Worker:
    """One worker process as the pool sees it: the job it holds and how far it got."""

    def __init__(self, ctx: Any, device: str | None, role: str, pool: WorkerPool) -> None:
        self.ctx, self.device, self.role, self.pool = ctx, device, role, pool
        self.process: Any = None
        self.conn: Any = None
        self.job: _Job | None = None
        self.done: set[int] = set()
        self.in_flight: int | None = None
        self.deadline = 0.0
        self.measured = 0
        self.fresh = True
        self.failed_starts = 0

    def start(self) -> None:
        parent, child = self.ctx.Pipe()
        # The Linux parent-death signal follows the starting thread: only the main thread's.
        main_thread = threading.current_thread() is threading.main_thread()
        self.process = self.ctx.Process(
            target=worker_main,
            args=(child, self.device, self.role == "warmer", main_thread),
            daemon=True,
            name=f"moetune-{self.role}",
        )
        with children_ignore_interrupts():
            self.process.start()
        child.close()
        self.conn, self.measured, self.fresh = parent, 0, True

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if not kill and self.process.is_alive():
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            self.process.join(5)
        if self.process.is_alive():
            # Its own children (Triton's ptxas) ignore SIGINT like it does: they go with it.
            below = descendants(self.process.pid)
            self.process.kill()
            for pid in below:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.process.join(5)
        self.conn.close()
        self.process, self.conn = None, None

    def assign(self, job: _Job) -> None:
        if self.process is None:
            self.start()
        self.job, self.done, self.in_flight = job, set(), None
        wait = self.pool.startup_timeout_s if self.fresh else self.pool.timeout_s
        self.deadline = time.monotonic() + wait
        self.conn.send(job.unit)

    def request(self, message: str) -> Any:
        """Ask the worker for `message` and wait for the reply (TuneError if it fails)."""
        if self.process is None:
            self.start()
        self.conn.send(message)
        try:
            if not self.conn.poll(self.pool.startup_timeout_s):
                self.stop(kill=True)
                raise TuneError(f"no {message} within {self.pool.startup_timeout_s:g} s")
            reply = self.conn.recv()
        except (EOFError, OSError):
            self.stop(kill=True)
            raise TuneError(f"the {self.role} worker died while measuring {message}") from None
        if reply[0] == "error":
            raise TuneError(reply[1])
        return reply[1]

    def waitables(self) -> list[Any]:
        return [self.conn, self.process.sentinel]

    def poll(self) -> tuple[list[Outcome], bool]:
        """Read what the process said: new outcomes, and whether the job must be requeued."""
        job = self.job
        assert job is not None
        outcomes: list[Outcome] = []
        try:
            while self.conn.poll():
                message = self.conn.recv()
                now = time.monotonic()
                if message[0] == "start":
                    self.in_flight, self.fresh = message[1], False
                    self.deadline = now + self.pool.timeout_s
                elif message[0] == "result":
                    outcomes.append(message[2])
                    self.done.add(message[1])
                    self.in_flight, self.measured = None, self.measured + 1
                    self.deadline = now + self.pool.timeout_s
                elif message[0] == "done":
                    self.job, self.failed_starts = None, 0
                    if self.measured >= self.pool.recycle_after:
                        self.stop()
                    return outcomes, False
        except (EOFError, OSError):
            pass  # the process died mid-message; handled below
        if not self.process.is_alive():
            self.process.join()
            if self.process.exitcode in STOP_EXIT_CODES:
                # Most likely a signal to the whole process group: give this process's own
                # copy a moment to arrive and stop the run, rather than record a crash.
                time.sleep(STOP_GRACE_S)
            why = f"worker process died ({describe_exit(self.process.exitcode)})"
            if self.process.exitcode == POISONED_EXIT:
                why = "worker restarted after a CUDA error"
            return outcomes + self._fail("crashed", why), self._rest()
        if time.monotonic() > self.deadline:
            why = f"no result within {self.pool.timeout_s:g} s; worker killed"
            return outcomes + self._fail("timeout", why), self._rest()
        return outcomes, False

    def _fail(self, status: str, why: str) -> list[Outcome]:
        job = self.job
        assert job is not None
        victim = self.in_flight
        self.stop(kill=True)
        if victim is not None:
            self.done.add(victim)
            return [Outcome(job.unit.candidates[victim], status, error=why)]
        if status == "crashed" and self.done:
            return []  # died right after reporting (a poisoned context): nothing lost
        self.failed_starts += 1
        if self.failed_starts >= 2:
            # Dying before its first candidate twice: the process cannot start on this machine.
            where = "" if self.device is None else f" for GPU {self.device}"
            raise WorkerEnvironmentError(
                f"the {self.role} worker process cannot start{where} ({why}; its error is "
                "printed above)"
            )
        return []

    def _rest(self) -> bool:
        """Cut the job down to the candidates not yet done; True if any are left."""
        job = self.job
        assert job is not None
        self.job = None
        rest = tuple(c for i, c in enumerate(job.unit.candidates) if i not in self.done)
        job.unit = replace(job.unit, candidates=rest)
        return bool(rest)


FollowUp = Callable[[WorkUnit, list[Outcome]], Iterable[WorkUnit]]


class WorkerPool:
    """Timer processes (one per device) and optional warmer processes, with fault isolation.

    `devices` are ``CUDA_VISIBLE_DEVICES`` values, one per GPU, or ``[None]``
    to inherit the environment (one worker; the CPU, or a GPU Ray assigned).
    Warmers compile without launching the GEMM (see `enable_compile_only`), so
    they never share the GPU with a timing in progress.
    """

    def __init__(
        self,
        devices: Sequence[str | None],
        *,
        compile_workers: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        recycle_after: int = DEFAULT_RECYCLE_AFTER,
    ) -> None:
        if not devices:
            raise TuneError("no devices to run workers on")
        for name, value in (("timeout", timeout_s), ("startup timeout", startup_timeout_s)):
            if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
                raise TuneError(
                    f"the {name} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {value}"
                )
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.recycle_after = recycle_after
        ctx = multiprocessing.get_context("spawn")
        self.timers = [_Worker(ctx, device, "timer", self) for device in devices]
        self.warmers = [
            _Worker(ctx, devices[i % len(devices)], "warmer", self) for i in range(compile_workers)
        ]
        self._ceilings: Any = None

    @property
    def compile_workers(self) -> int:
        return len(self.warmers)

    @property
    def parallelism(self) -> int:
        return len(self.timers)

    def start(self) -> WorkerPool:
        """Start every worker process now, not at its first unit: each loads torch, Triton
        and its CUDA context (`_prepare`) while the caller goes on (planning, say)."""
        for worker in self.timers + self.warmers:
            if worker.process is None:
                worker.start()
        return self

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with signals_deferred():  # a second Ctrl-C must not leave a worker behind
            for worker in self.timers + self.warmers:
                worker.stop(kill=True)

    def measure_ceilings(self) -> Any:
        """Memory bandwidth and matmul rate measured by the first timer (GPU only), once:
        every plan of a run times on the same GPUs."""
        if self._ceilings is None:
            self._ceilings = self.timers[0].request("ceilings")
        return self._ceilings

    def run(
        self, units: Iterable[WorkUnit], then: FollowUp | None = None
    ) -> Iterator[tuple[WorkUnit, Outcome]]:
        """Measure every unit; yield (unit, outcome) per candidate as soon as it is known.

        "warm" units go to the warmers (to the timers if there are none), the
        rest to the timers. When a unit is complete, `then(unit, outcomes)` may
        return more units to run (a warmed chunk's timing, say), which start at once.
        An ``environment`` outcome is yielded (the caller may record it), then
        `WorkerEnvironmentError` is raised: nothing else can be measured here.
        """
        queues: dict[str, deque[_Job]] = {"timer": deque(), "warmer": deque()}

        def enqueue(unit: WorkUnit) -> None:
            if unit.mode not in MODES:
                raise ValueError(f"unknown mode {unit.mode!r}")
            role = "warmer" if unit.mode == "warm" and self.warmers else "timer"
            queues[role].append(_Job(unit))

        for unit in units:
            enqueue(unit)
        workers = self.timers + self.warmers
        try:
            yield from self._serve(workers, queues, enqueue, then)
        finally:
            # Left early (an exception here or in the caller): no worker may keep a unit whose
            # outcomes nobody reads, or the next run would read them as its own.
            for worker in workers:
                if worker.job is not None:
                    worker.job = None
                    worker.stop(kill=True)

    def _serve(
        self,
        workers: list[_Worker],
        queues: dict[str, deque[_Job]],
        enqueue: Callable[[WorkUnit], None],
        then: FollowUp | None,
    ) -> Iterator[tuple[WorkUnit, Outcome]]:
        while True:
            for worker in workers:
                if worker.job is None and queues[worker.role]:
                    worker.assign(queues[worker.role].popleft())
            busy = [worker for worker in workers if worker.job is not None]
            if not busy:
                return
            timeout = max(0.0, min(worker.deadline for worker in busy) - time.monotonic())
            multiprocessing.connection.wait(
                [w for worker in busy for w in worker.waitables()], timeout=timeout + 0.01
            )
            for worker in busy:
                job = worker.job
                assert job is not None
                outcomes, requeue = worker.poll()
                job.outcomes.extend(outcomes)
                for outcome in outcomes:
                    yield job.origin, outcome
                    raise_if_environment(outcome)
                if requeue:
                    queues[worker.role].appendleft(job)
                elif outcomes and job.finished and then is not None:
                    for unit in then(job.origin, job.outcomes):
                        enqueue(unit)
