"""Fixtures: a tuned save dir (fake GPU) and the recorded H200 save dirs of examples/."""

from __future__ import annotations

import json
import shutil

import pytest
from savedirs import EXAMPLES, EXISTING, tune_into

from moetune.engines.tuned_file import file_payload


@pytest.fixture
def clean_engine_env(monkeypatch):
    for variable in ("VLLM_TUNED_CONFIG_FOLDER", "SGLANG_MOE_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def tuned(tmp_path, clean_engine_env):
    """A save dir tuned for both engines, compared with an existing vLLM file."""
    existing = tmp_path / "existing"
    existing.mkdir()
    name = "E=4,N=32,device_name=NVIDIA_H200.json"
    (existing / name).write_text(
        json.dumps(file_payload("vllm", {1: EXISTING.as_config()}, "3.6.0"))
    )
    save_dir = tmp_path / "tuned-h200"
    tune_into(save_dir, compare_dir=existing)
    return save_dir


@pytest.fixture
def recorded(tmp_path):
    """The two recorded H200 save dirs of examples/, copied (a report writes into the first)."""
    dirs = []
    for name in ("h200-2026-12-01", "h200-2026-11-30"):
        shutil.copytree(EXAMPLES / name, tmp_path / name, ignore=shutil.ignore_patterns("report"))
        dirs.append(tmp_path / name)
    return dirs
