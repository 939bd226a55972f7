"""The quantization note suggests only dtypes `moetune tune --dtype` accepts."""

import re

from moetune.commands.options import DTYPE_CHOICES
from moetune.extract.report import build_report


def test_note_for_a_checkpoint_the_kernel_does_not_read_names_only_tunable_dtypes():
    report = build_report("moonshotai/Kimi-K3", tp=8, ep=True, device_name="NVIDIA_H200")
    (note,) = [n for n in report.notes if "Pass --dtype" in n]
    suggested = re.search(r"Pass --dtype \(([^)]*)\)", note).group(1).split(", ")
    assert suggested and set(suggested) <= set(DTYPE_CHOICES), suggested
