"""Print this folder's Markdown tables from its raw files (python tables.py)."""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def tune_table(path: Path) -> str:
    data = json.loads(path.read_text())
    keys = [b["key"] for b in data["baselines"]]
    head = "| M | tuned config (BM/BN/BK/G/warps/stages) | tuned us | " + " | ".join(
        f"{k} us (speedup)" for k in keys
    )
    lines = [head + " |", "|---:|---|---:|" + "---:|" * len(keys)]
    for row in data["results"]:
        c = row["config"]
        config = (
            "/".join(
                str(c[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
            )
            + f"/{c['num_warps']}/{c['num_stages']}"
        )
        cells = [
            f"{row['baselines'][k]['latency_us']:.1f} ({row['baselines'][k]['speedup']:.3f}x)"
            for k in keys
        ]
        lines.append(
            f"| {row['batch_size']} | {config} | {row['latency_us']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    geo = ", ".join(f"{k} {v:.3f}x" for k, v in data["geomean_speedup"].items())
    worst = {k: min(r["baselines"][k]["speedup"] for r in data["results"]) for k in keys}
    lines.append("")
    lines.append(
        f"Geomean speedup: {geo}. Lowest per-M speedup: "
        + ", ".join(f"{k} {v:.3f}x" for k, v in worst.items())
        + "."
    )
    return "\n".join(lines)


def main() -> int:
    print("## DeepSeek-V3 fp8 TP8 on vLLM 0.33.0's kernel\n")
    print(tune_table(HERE / "call3" / "dsv3-tp8-vllm" / "tune.json"))
    print("\n## Qwen3-30B-A3B TP1 bf16 on vLLM 0.33.0's kernel\n")
    print(tune_table(HERE / "call2" / "qwen3-tp1-vllm" / "tune.json"))
    print("\n## Qwen3-30B-A3B TP1 bf16 for SGLang, on SGLang 0.5.23's kernel\n")
    print(tune_table(HERE / "call4" / "qwen3-tp1-sglang" / "tune.json"))
    for name, path in (
        ("vLLM 0.33.0", HERE / "call1" / "fidelity_vllm.jsonl"),
        ("vLLM 0.33.0 (Mixtral)", HERE / "call2" / "fidelity_vllm_mixtral.jsonl"),
        ("SGLang 0.5.23", HERE / "call1" / "fidelity_sglang.jsonl"),
        ("vLLM 0.33.0, after the twin's rewrite", HERE / "call5" / "fidelity_vllm_twin_rev2.jsonl"),
    ):
        print(f"\n## Rank fidelity, twin vs {name}\n")
        out = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "fidelity.py"), "--report", str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(out.stdout.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
