"""Shared fixtures: tiny synthetic checkpoints made once per session, and the ../shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
VOICES = SHARED / "fixtures" / "voices"
REAL_PRESETS = {  # name: (L_lm, L_tts), facts sheet 2.4
    "en-Davis_man": (60, 183),
    "en-Grace_woman": (57, 209),
    "en-Mike_man": (49, 148),
}


def need_shared_voices() -> Path:
    if not all((VOICES / f"{name}.pt").is_file() for name in REAL_PRESETS):
        pytest.skip("../shared/fixtures/voices is not available")
    return VOICES


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    from vibevoice_onnx.checkpoints.synthetic import make_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for kind in ("realtime", "1.5b", "asr", "asr-hf"):
        make_checkpoint(kind, root / kind, size="tiny", seed=0)
        out[kind] = root / kind
    return out


@pytest.fixture(scope="session")
def realtime_reference(tiny_checkpoints):
    from vibevoice_onnx.reference.loading import load_realtime

    return load_realtime(tiny_checkpoints["realtime"])
