"""Real routing: replay a dump of `topk_ids` instead of uniform random routing.

`moetune tune --routing PATH` reads one of:

- a folder in the layout SGLang's ``tuning_fused_moe_triton_sep.py --topk-ids-dir``
  reads: files ``topk_ids_layer{L}_idx{I}.pt``, each a ``torch.save``d integer
  tensor ``[tokens, top_k]`` of one MoE layer's routing for one forward pass.
  SGLang takes its 100 samples in the order ``i -> (layer i % moe_layers,
  idx i // moe_layers)``, i.e. every layer of snapshot 0, then of snapshot 1;
  files are ordered the same way here (by idx, then layer);
- one ``.pt`` (``torch.save``) or ``.npy`` file holding a ``[tokens, top_k]``
  integer tensor (a list or dict of such tensors in a ``.pt`` is refused).

Each file is a *segment*. For batch size M, routing window j is M consecutive
rows of segment ``j % segments``, starting at row ``(j // segments) * M``
(wrapping around the segment's end): with one file per forward pass this is
SGLang's "first M rows of sample j"; with a single long tensor the windows walk
through it. The timing harness takes windows 0, 1, 2, ... for its rotating
routing buffers, as uniform timing draws fresh random logits for each.

Every id must be a local expert (0 <= id < E) and the width must be the
problem's top-k; anything else is a one-line `TuneError`. Routing weights are
not dumped by the engines and do not change the kernel's work; they are drawn
at random (positive, summing to 1 per token).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.errors import TuneError
from moetune.fileio import open_input

SGLANG_FILE = re.compile(r"^topk_ids_layer(\d+)_idx(\d+)\.pt$")
UNIFORM = "uniform"


@dataclass(frozen=True)
class RoutingDump:
    """The loaded dump: segments of expert ids, each a numpy int32 array ``[tokens, top_k]``."""

    path: str
    segments: tuple[Any, ...]
    digest: str  # names the dump in the results store (timings depend on it)

    @property
    def tokens(self) -> int:
        return sum(len(segment) for segment in self.segments)

    def describe(self, num_experts: int) -> str:
        """One line for the plan: size and how skewed the load is."""
        counts = expert_histogram(self.segments, num_experts)
        total = max(1, int(counts.sum()))
        hottest = int(counts.argmax())
        share = counts[hottest] / total
        return (
            f"{self.path} ({self.tokens} tokens in {len(self.segments)} segment(s); "
            f"hottest expert {hottest} gets {100 * share:.1f} % of slots, "
            f"uniform would be {100 / num_experts:.1f} %)"
        )


def _to_numpy(value: Any, label: str) -> Any:
    import numpy as np

    if hasattr(value, "detach"):  # a torch tensor (maybe saved from a GPU)
        value = value.detach().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise TuneError(
            f"{label}: expected a [tokens, top_k] integer tensor, got {type(value).__name__}"
        )
    return value


def _load_file(path: Path) -> Any:
    label = str(path)
    if path.suffix not in (".npy", ".pt"):
        raise TuneError(f"{label}: a routing dump is a .pt or .npy file, or a folder of .pt files")
    try:
        handle = open_input(path, limit=None)  # a dump may be large; never a FIFO or a device
    except OSError as exc:
        raise TuneError(f"{label}: cannot read a routing dump: {exc.strerror or exc}") from None
    try:
        with handle:
            if path.suffix == ".npy":
                import numpy as np

                value = np.load(handle, allow_pickle=False)
            else:
                import torch

                value = torch.load(handle, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one line
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TuneError(
            f"{label}: cannot read it as a routing dump ({type(exc).__name__}: {first})"
        ) from None
    return _to_numpy(value, label)


def _check(array: Any, label: str, num_experts: int, top_k: int) -> Any:
    import numpy as np

    if array.ndim != 2:
        raise TuneError(
            f"{label}: expected a [tokens, top_k] tensor, got shape {list(array.shape)}"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise TuneError(f"{label}: expert ids must be integers, got {array.dtype}")
    if array.shape[1] != top_k:
        raise TuneError(
            f"{label}: top-k is {array.shape[1]} in the dump but {top_k} in the model; "
            "dump the same model (and layer type) you tune"
        )
    if array.shape[0] == 0:
        raise TuneError(f"{label}: the dump holds no tokens")
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= num_experts:
        bad = low if low < 0 else high
        raise TuneError(
            f"{label}: expert id {bad} is outside 0..{num_experts - 1} (E={num_experts} on this "
            "rank); dump the routing as this rank sees it (local expert ids)"
        )
    return np.ascontiguousarray(array, dtype=np.int32)


def sglang_dump_files(folder: Path) -> list[Path]:
    """The ``topk_ids_layer{L}_idx{I}.pt`` files of a folder, in SGLang's sample order."""
    found = []
    for path in folder.iterdir():
        match = SGLANG_FILE.match(path.name)
        if match:
            found.append(((int(match.group(2)), int(match.group(1))), path))
    return [path for _, path in sorted(found)]


def load_routing(path: str | Path, num_experts: int, top_k: int) -> RoutingDump:
    """Load and check a routing dump (see the module docstring for the formats)."""
    source = Path(path)
    if not source.exists():
        raise TuneError(f"{source}: no such routing dump (pass --routing uniform or a dump path)")
    if source.is_dir():
        files = sglang_dump_files(source)
        if not files:
            raise TuneError(
                f"{source}: no topk_ids_layer<L>_idx<I>.pt files (SGLang's --topk-ids-dir layout)"
            )
    else:
        files = [source]
    segments = tuple(_check(_load_file(f), str(f), num_experts, top_k) for f in files)
    digest = hashlib.sha256()
    for segment in segments:
        digest.update(repr(segment.shape).encode())
        digest.update(segment.tobytes())
    return RoutingDump(str(source.resolve()), segments, digest.hexdigest()[:12])


def window(dump: RoutingDump, batch_size: int, index: int) -> Any:
    """Routing window `index` for `batch_size` tokens: ``[batch_size, top_k]`` int32."""
    import numpy as np

    segments = dump.segments
    segment = segments[index % len(segments)]
    start = (index // len(segments)) * batch_size
    rows = (start + np.arange(batch_size)) % len(segment)
    return segment[rows]


def expert_histogram(arrays: Any, num_experts: int) -> Any:
    """Slots per expert over `arrays` (numpy or torch, any shape)."""
    import numpy as np

    counts = np.zeros(num_experts, dtype=np.int64)
    for array in arrays:
        flat = _to_numpy(array, "routing").reshape(-1)
        counts += np.bincount(flat[flat >= 0], minlength=num_experts)[:num_experts]
    return counts


def random_weights(batch_size: int, top_k: int, seed: int) -> Any:
    """Positive routing weights summing to 1 per token (float32 numpy ``[M, top_k]``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = rng.random((batch_size, top_k), dtype=np.float32) + 0.1
    return weights / weights.sum(axis=1, keepdims=True)


def with_routing(problem: Any, path: str | Path) -> Any:
    """`problem` (a `TuneProblem`) replaying the dump at `path`, checked against its E and top-k."""
    from dataclasses import replace

    dump = load_routing(path, problem.num_experts, problem.top_k)
    return replace(problem, routing=dump.path, routing_digest=dump.digest)
