"""Why one decode-size (M = 1) timing moves between processes, factor by factor.

The tuner times a whole fused-MoE call in a CUDA graph of several calls, each call
reading router logits redrawn from the global RNG before every replay
(`moetune.tune.measure.timing.time_graph`). Between two processes the same config's
median has been seen to move by about 10 % at M = 1. This script times one config at
M = 1 in several fresh processes, with one factor changed at a time, so the spread
between processes can be set against the spread inside one:

- ``draws``: the routing draws differ between processes (each process seeds the
  global RNG with its own number), as in a tune, where every worker's history differs;
- ``seeded``: every process draws the same routings (the RNG reseeded before each timing);
- ``placed``: the same draws, but the weights land elsewhere in memory (a padding
  allocation of a random size before the problem is made);
- ``flushed``: the same draws, and the L2 cache is overwritten before every replay
  (outside the timed region), so no replay starts with another one's weights in L2.

    python bench/decode_stability.py --out DIR [--processes 5] [--repeats 6]
        [--shape 128,768,2048,8] [--dtype bf16] [--block-shape 128,128] [--config 16,64,128,1,4,3]

Each process times the config ``--repeats`` times (a fresh graph each), records the GPU's
SM clock, temperature and power around every timing (nvidia-smi), and writes one JSON line
per timing to DIR/decode_stability.jsonl; the processes of the variants are interleaved
(variant 1 process 1, variant 2 process 1, ...), so drift over the run touches every variant.
The table printed at the end gives per variant: the median of every timing, the spread
between the process medians (max / min - 1) and the median spread inside one process.
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

VARIANTS = ("draws", "seeded", "placed", "flushed")
L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times the H100's/H200's 50 MB L2


def gpu_state() -> dict:
    """The SM clock (MHz), temperature (C) and power (W) nvidia-smi reports now."""
    query = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")[0]
        sm, mem, temp, power = (float(v) for v in out.split(","))
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    return {"sm_mhz": sm, "mem_mhz": mem, "temp_c": temp, "power_w": power}


def child(args: argparse.Namespace) -> None:
    """One process: time the config `args.repeats` times under `args.variant`."""
    import torch

    from moetune.kernel.problem import make_problem
    from moetune.tune.measure import timing

    variant, process = args.variant, args.process
    torch.manual_seed(1000 + process if variant == "draws" else 0)
    padding = None
    if variant == "placed":
        rng = random.Random(process)
        padding = torch.empty(
            rng.randrange(1, 4096) * 1024 * 1024, dtype=torch.uint8, device="cuda"
        )
    E, N, K, top_k = (int(v) for v in args.shape.split(","))
    block = tuple(int(v) for v in args.block_shape.split(",")) if args.block_shape else None
    problem = make_problem(1, E, N, K, top_k, args.dtype, block_shape=block, device="cuda")
    keys = (
        "BLOCK_SIZE_M",
        "BLOCK_SIZE_N",
        "BLOCK_SIZE_K",
        "GROUP_SIZE_M",
        "num_warps",
        "num_stages",
    )
    config = dict(zip(keys, (int(v) for v in args.config.split(",")), strict=True))
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    class Bench(timing._WholeCalls):
        def refill(self) -> None:
            super().refill()
            if variant == "flushed":
                flush.fill_(1)

    level = timing.fidelity_of("full")
    with open(args.out / "decode_stability.jsonl", "a") as sink:
        for repeat in range(args.repeats):
            if variant != "draws":
                torch.manual_seed(repeat)  # the same draws in every process
            before = gpu_state()
            t = timing.time_graph(Bench(problem, config), level)
            row = {
                "variant": variant,
                "process": process,
                "repeat": repeat,
                "median_us": t.median_us,
                "p20_us": t.p20_us,
                "p80_us": t.p80_us,
                "calls_per_replay": t.calls_per_replay,
                "before": before,
                "after": gpu_state(),
                "shape": args.shape,
                "dtype": args.dtype,
                "config": config,
            }
            sink.write(json.dumps(row) + "\n")
            sink.flush()
    del padding


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = [
        f"{'variant':<8} {'timings':>7} {'median us':>10} {'between processes':>18} "
        f"{'inside one':>11} {'SM MHz min-max':>15}"
    ]
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        if not mine:
            continue
        processes = sorted({r["process"] for r in mine})
        medians = [
            statistics.median(r["median_us"] for r in mine if r["process"] == p) for p in processes
        ]
        inside = [
            max(r["median_us"] for r in mine if r["process"] == p)
            / min(r["median_us"] for r in mine if r["process"] == p)
            - 1
            for p in processes
        ]
        clocks = [r["before"].get("sm_mhz") for r in mine if r["before"].get("sm_mhz")]
        clock = f"{min(clocks):.0f}-{max(clocks):.0f}" if clocks else "-"
        lines.append(
            f"{variant:<8} {len(mine):>7} {statistics.median(r['median_us'] for r in mine):>10.2f} "
            f"{max(medians) / min(medians) - 1:>17.1%} {statistics.median(inside):>10.1%} {clock:>15}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--shape", default="128,768,2048,8", help="E,N,K,top_k")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--block-shape", default=None)
    parser.add_argument("--config", default="16,64,128,1,4,3", help="BM,BN,BK,GROUP_M,warps,stages")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.variant:
        child(args)
        return 0
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    for process in range(args.processes):
        for variant in args.variants.split(","):
            command = [
                sys.executable,
                __file__,
                *passed,
                "--variant",
                variant,
                "--process",
                str(process),
            ]
            done = subprocess.run(command)
            if done.returncode:
                print(f"{variant} process {process}: exit {done.returncode}", file=sys.stderr)
    print(table(args.out / "decode_stability.jsonl"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
