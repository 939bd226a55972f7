"""What one measurement times: the whole call, one GEMM alone, or the call with split configs.

The tuner times four kinds of thing (`KINDS`):

| kind    | what runs (timed)                                  | configs                                |
|---------|----------------------------------------------------|----------------------------------------|
| `whole` | the fused call, one config for both GEMMs          | `candidate` (a plain `Candidate`)      |
| `up`    | the gate/up GEMM alone, on pre-aligned routings    | `candidate`, TMA if `use_tma`          |
| `down`  | the down GEMM alone, on pre-aligned routings       | `candidate`, TMA if `use_tma`          |
| `pair`  | the fused call with an up and a down config        | `candidate` (up, TMA `use_tma`) and    |
|         |                                                    | `down` (TMA `down_tma`)                |

A plain `Candidate` is a `whole` measurement; a `Probe` is any of the other
three. Probes travel through the same worker pool and results store as
candidates (the store keys on all of their fields), so resume and fault
isolation cover them unchanged. This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moetune.errors import TuneError
from moetune.kernel.config import CONFIG_KEYS, Candidate

KINDS = ("whole", "up", "down", "pair")


@dataclass(frozen=True)
class Probe:
    """One split-config measurement: `kind` of `candidate` (and, for a pair, `down`).

    The six kernel keys read through to `candidate` (``probe.BLOCK_SIZE_M``), so
    test fault injection and logs treat a probe like the config it times.
    """

    kind: str
    candidate: Candidate
    use_tma: bool = False
    down: Candidate | None = None
    down_tma: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS[1:]:
            raise TuneError(f"probe kind must be one of {', '.join(KINDS[1:])}, got {self.kind!r}")
        if (self.kind == "pair") != (self.down is not None):
            raise TuneError("a pair probe needs a down config, and only a pair probe has one")
        if self.kind != "pair" and self.down_tma:
            raise TuneError("down_tma belongs to pair probes; a down probe uses use_tma")
        if self.down is not None and self.down.BLOCK_SIZE_M != self.candidate.BLOCK_SIZE_M:
            raise TuneError(
                f"the up and down configs of a pair share BLOCK_SIZE_M (one alignment feeds "
                f"both GEMMs): {self.candidate.BLOCK_SIZE_M} != {self.down.BLOCK_SIZE_M}"
            )

    def __getattr__(self, name: str) -> Any:
        if name in CONFIG_KEYS:
            candidate = self.__dict__.get("candidate")
            if candidate is not None:
                return getattr(candidate, name)
        raise AttributeError(name)

    @classmethod
    def single(cls, candidate: Candidate) -> Probe:
        """The one-config call timed in the pair harness (what vLLM runs), for a fair comparison."""
        return cls("pair", candidate, False, candidate, False)

    def up_config(self) -> dict[str, Any]:
        """The up GEMM's config as the kernel takes it (``USE_TMA`` only when on)."""
        config: dict[str, Any] = self.candidate.as_config()
        if self.use_tma:
            config["USE_TMA"] = True
        return config

    def down_config(self) -> dict[str, Any]:
        """The down GEMM's config as the kernel takes it (pair probes only)."""
        if self.down is None:
            raise TuneError(f"a {self.kind} probe has no down config")
        config: dict[str, Any] = self.down.as_config()
        if self.down_tma:
            config["USE_TMA"] = True
        return config

    def as_config(self) -> dict[str, Any]:
        """The config of the GEMM this probe times (the up one for a pair)."""
        return self.up_config()

    @property
    def uses_tma(self) -> bool:
        return self.use_tma or self.down_tma

    def short(self) -> str:
        tma = " TMA" if self.use_tma else ""
        if self.kind != "pair":
            return f"{self.kind} {self.candidate.short()}{tma}"
        assert self.down is not None
        down_tma = " TMA" if self.down_tma else ""
        return f"up {self.candidate.short()}{tma} + down {self.down.short()}{down_tma}"


def probe_fields(item: Candidate | Probe) -> tuple[str, Candidate, bool, Candidate | None, bool]:
    """(kind, candidate, use_tma, down, down_tma) of a candidate (kind "whole") or a probe."""
    if isinstance(item, Probe):
        return item.kind, item.candidate, item.use_tma, item.down, item.down_tma
    return "whole", item, False, None, False


def from_fields(
    kind: str, candidate: Candidate, use_tma: bool, down: Candidate | None, down_tma: bool
) -> Candidate | Probe:
    """The inverse of `probe_fields`."""
    if kind == "whole":
        return candidate
    return Probe(kind, candidate, use_tma, down, down_tma)
