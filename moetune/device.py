"""The GPU the tune runs on: the device facts pruning and the plan need.

`DeviceLimits` is the seam for other GPUs: a new vendor adds a constructor here
(and its limits) rather than a branch in the tuner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from moetune.errors import TuneError


def interpreter_requested() -> bool:
    """True when ``TRITON_INTERPRET`` asks for Triton's CPU interpreter.

    The interpreter is a CPU tool: a run under it times on the CPU even where a GPU is
    visible (its launches on CUDA tensors copy every argument to the host and back, and an
    engine kernel's host-side TMA descriptors do not survive that), so the workers get
    no GPU and the files are named for the CPU.
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class DeviceLimits:
    """The device facts pruning needs."""

    shared_memory_per_block: int  # bytes a block may opt in to (Triton's `max_shared_mem`)
    num_sms: int
    name: str
    # NVIDIA's compute capability, (9, 0) for Hopper; None if unknown or not NVIDIA.
    compute_capability: tuple[int, int] | None = None

    @classmethod
    def h200(cls) -> DeviceLimits:
        """NVIDIA H200 (Hopper, sm_90): 227 KiB opt-in shared memory per block, 132 SMs."""
        return cls(
            shared_memory_per_block=232_448,
            num_sms=132,
            name="NVIDIA H200",
            compute_capability=(9, 0),
        )

    @classmethod
    def from_torch(cls, device_index: int = 0) -> DeviceLimits:
        """Read the limits of a visible CUDA device (imports torch).

        A ROCm build reports its GPU's gfx version as major/minor (9, 4 for MI300);
        that is no compute capability, so it is left unknown there.
        """
        import torch

        if not torch.cuda.is_available():
            raise TuneError("no CUDA GPU is visible; cannot read the device's limits")
        props = torch.cuda.get_device_properties(device_index)
        shared = getattr(props, "shared_memory_per_block_optin", 0)
        if not shared:
            from triton.runtime import driver

            shared = driver.active.utils.get_device_properties(device_index)["max_shared_mem"]
        return cls(
            shared_memory_per_block=int(shared),
            num_sms=int(props.multi_processor_count),
            name=props.name,
            compute_capability=None
            if getattr(torch.version, "hip", None)
            else (int(props.major), int(props.minor)),
        )
