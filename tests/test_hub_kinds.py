"""VibeVoice-ASR and VibeVoice-1.5B by their Hub ids, through the local stand-in for the Hub (tests/hub_standin.py):
sharded checkpoints, the checkpoint's own tokenizer for ASR, one fetched from Qwen's repository for the 1.5B. Both
in the base install (torch cannot be imported: the graphs are written, in seconds); the first use with torch,
tracing and verifying against PyTorch, is test_hub.py's, and past the download the kinds share that path."""

from __future__ import annotations

import json

from conftest import write_voice_sample
from hub_standin import ASR_ID, TTS15B_ID, cli, environment


def built_manifests(home) -> dict[str, dict]:
    return {m["model_kind"]: m for m in (json.loads(p.read_text()) for p in home.glob("bundles/*/*/cpu_fp32/manifest.json"))}


def fetched_names(hub) -> set[str]:
    return {path.split("/resolve/")[1].split("/", 1)[1] for path in hub.downloads()}


def test_asr_by_id(hub, tmp_path):
    hub.requests.clear()
    clip = write_voice_sample(tmp_path / "clip.wav", seconds=1.5, rate=24000, channels=1)
    heard = cli("transcribe", "--model", ASR_ID, "--precision", "fp32", clip, "--mean-latents", "--max-new-tokens", "6", "--format", "json",
                env=environment(tmp_path, hub.endpoint, base_install=True))
    assert "first use: writing the graphs of an asr fp32 bundle" in heard.stderr, heard.stderr
    assert "6 tokens" in heard.stderr and isinstance(json.loads(heard.stdout), dict)
    fetched = fetched_names(hub)
    assert {f"model-{i:05d}-of-00008.safetensors" for i in range(1, 9)} | {"model.safetensors.index.json"} <= fetched
    assert "unused.bin" not in fetched and "README.md" not in fetched
    manifest = built_manifests(tmp_path / "home")["asr"]
    assert manifest["source"]["repo"] == ASR_ID and "tokenizer" not in manifest["source"]  # the checkpoint's own


def test_15b_by_id(hub, tmp_path):
    hub.requests.clear()
    sample = write_voice_sample(tmp_path / "alice.flac")
    spoken = cli("speak", "--model", TTS15B_ID, "--precision", "fp32", "Speaker 1: Hello there.", "--speaker", f"1={sample}",
                 "--seed", "3", "--max-frames", "6", "-o", tmp_path / "id.wav",
                 env=environment(tmp_path, hub.endpoint, base_install=True))
    assert "first use: writing the graphs of a 1.5b fp32 bundle" in spoken.stderr, spoken.stderr
    assert "frames 6 (max_frames)" in spoken.stderr
    assert {f"model-{i:05d}-of-00003.safetensors" for i in range(1, 4)} <= fetched_names(hub)
    manifest = built_manifests(tmp_path / "home")["1.5b"]
    assert manifest["source"]["tokenizer"].startswith("Qwen/Qwen2.5-1.5B@")  # the repository ships none
