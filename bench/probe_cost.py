"""What one timing costs on the timer, per kind, with the routing stream kept and without.

The split search's lone-GEMM timings refill every routing slot before every replay
(`moetune.tune.measure.probe_timing`). Since the routing stream is kept per batch
size (`RoutingStream`), a refill is a few copies instead of a fresh draw and
alignment per slot. This script times the same probes both ways, interleaved in
one process, on the tuner's own harness (`measure_probe`, full fidelity unless
`--fidelity`): the wall seconds each timing took on the timer, and the latency it
measured (the same routings both ways, so the latencies must agree within noise).

    python bench/probe_cost.py --out DIR [--shape E,N,K,TOPK] [--dtype bf16] [--batch-sizes 1,16,256,4096]

Writes DIR/probe_cost.jsonl (one line per timing) and prints a table per kind and M:
median wall seconds per timing fresh / kept, and the median latency both ways.
Needs a CUDA GPU (on the CPU it runs under TRITON_INTERPRET=1, slowly, to check
the script).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from moetune.kernel.config import Candidate
from moetune.kernel.probe import Probe
from moetune.tune.api import TuneProblem

# One tile per kind that runs on every dtype of the grid (BLOCK_SIZE_K 128: fp8 block's k).
TILE = Candidate(16, 64, 128, 1, 4, 3)
LARGE_TILE = Candidate(64, 128, 128, 1, 4, 3)


def probes(tile: Candidate) -> dict[str, object]:
    return {
        "up": Probe("up", tile),
        "down": Probe("down", tile),
        "down_tma": Probe("down", tile, use_tma=True),
        "pair": Probe("pair", tile, down=tile),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", default="128,192,4096,8", help="E,N,K,top_k")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--block-shape", default=None, help="fp8 block, e.g. 128,128")
    parser.add_argument("--batch-sizes", default="1,16,256,4096")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--fidelity", default="full")
    args = parser.parse_args(argv)

    import torch

    from moetune.kernel.problem import make_problem
    from moetune.tune.api import drop_routing_streams, measure_probe

    e, n, k, top_k = (int(v) for v in args.shape.split(","))
    block = tuple(int(v) for v in args.block_shape.split(",")) if args.block_shape else None
    problem = TuneProblem(e, n, k, top_k, args.dtype, block_shape=block)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(args.out / "probe_cost.jsonl", "w") as log:
        for m in (int(v) for v in args.batch_sizes.split(",")):
            data = make_problem(m, e, n, k, top_k, args.dtype, block_shape=block, device=device)
            tile = TILE if m < 256 else LARGE_TILE
            for kind, item in probes(tile).items():
                for repeat in range(args.repeats):
                    for mode in ("fresh", "kept"):  # interleaved: drift hits both alike
                        if mode == "fresh":
                            drop_routing_streams()
                        start = time.perf_counter()
                        outcome = measure_probe(problem, m, args.fidelity, item, data)
                        if device == "cuda":
                            torch.cuda.synchronize()
                        row = {
                            "batch_size": m,
                            "kind": kind,
                            "mode": mode,
                            "repeat": repeat,
                            "status": outcome.status,
                            "wall_s": time.perf_counter() - start,
                            "latency_us": outcome.latency_us,
                            "error": outcome.error,
                        }
                        rows.append(row)
                        log.write(json.dumps(row) + "\n")
                        log.flush()
    print(f"{'M':>6} {'kind':9} {'fresh s':>8} {'kept s':>8} {'fresh us':>10} {'kept us':>10}")
    keys = sorted({(r["batch_size"], r["kind"]) for r in rows}, key=lambda t: (t[0], t[1]))
    for m, kind in keys:
        cell = {}
        for mode in ("fresh", "kept"):
            # The first repeat builds the stream (kept) or warms Triton's cache: left out.
            ok = [r for r in rows if (r["batch_size"], r["kind"], r["mode"]) == (m, kind, mode)]
            ok = [r for r in ok if r["status"] == "ok" and r["repeat"] > 0]
            cell[mode] = (
                (
                    statistics.median(r["wall_s"] for r in ok),
                    statistics.median(r["latency_us"] for r in ok),
                )
                if ok
                else None
            )
        if cell["fresh"] is None or cell["kept"] is None:
            print(f"{m:>6} {kind:9} not timed ({rows[-1]['error'] if rows else ''})")
            continue
        (fw, fl), (kw, kl) = cell["fresh"], cell["kept"]
        print(f"{m:>6} {kind:9} {fw:8.3f} {kw:8.3f} {fl:10.2f} {kl:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
