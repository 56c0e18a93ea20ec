"""Shared fixtures: tiny synthetic checkpoints made once per session, and the ../shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The suite runs two xdist workers on two cores. PyTorch's OpenMP threads spin while they wait, so two workers of
# two threads each slowed each other tenfold: two verifies of the tiny 1.5B at once took 109 s, against 10 s with
# one thread each (9 s for one alone, with either). One thread a worker; the commands the tests start inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
VOICES = SHARED / "fixtures" / "voices"
REAL_PRESETS = {  # name: (L_lm, L_tts), facts sheet 2.4
    "en-Davis_man": (60, 183),
    "en-Grace_woman": (57, 209),
    "en-Mike_man": (49, 148),
}


# The files that take longest, started first (each worker takes whole files, in the order collected: one of these
# collected last, as test_writer.py is alphabetically, ran alone at the end while the other worker had finished).
# Only the order changes, so a file missing here or renamed costs time, never a result.
LONGEST_FIRST = ("test_writer.py", "test_browser_site.py", "test_cluster.py", "test_hub.py", "test_precision_tts15b.py",
                 "test_large.py", "test_teacher_gates.py", "test_asr.py", "test_readme.py", "test_runtime.py",
                 "test_batching.py", "test_gpu_benchmark.py", "test_precision.py", "test_asr_streaming_onnx.py",
                 "test_fixed.py", "test_full_disk.py", "test_base_install.py", "test_tts15b.py")


def pytest_collection_modifyitems(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the others keep their order


def need_shared_voices() -> Path:
    if not all((VOICES / f"{name}.pt").is_file() for name in REAL_PRESETS):
        pytest.skip("../shared/fixtures/voices is not available")
    return VOICES


SHARED_DIR_ENV = "VIBEVOICE_TEST_SHARED_DIR"  # benchmarks/mutation.py: one for its many short runs of the same code


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A folder every xdist worker of this run sees (the parent of each worker's own base folder): what the
    session fixtures make once for all workers lives there (the tiny checkpoints and their bundles). Read from
    xdist's environment, not its `worker_id` fixture, so a run without xdist loaded (mutmut's) works too; or the
    folder SHARED_DIR_ENV names, which a caller running the same code many times gives each run."""
    if os.environ.get(SHARED_DIR_ENV):
        return Path(os.environ[SHARED_DIR_ENV])
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(shared: Path, name: str, make) -> Path:
    """shared/name as `make(path)` leaves it: made by the first worker that asks, while the others wait for it
    (each would otherwise spend the same minutes on the same build). What it makes is read-only to tests."""
    import shutil

    from filelock import FileLock

    path, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            make(path)
            done.touch()
    return path


TINY_KINDS = ("realtime", "1.5b", "large", "asr", "asr-hf", "asr-streaming", "asr-bitnet")  # streaming: the 1.5B variant


@pytest.fixture(scope="session")
def tiny_checkpoints(shared_dir) -> dict[str, Path]:
    from vibevoice_onnx.checkpoints.synthetic import make_checkpoint

    def make(root: Path) -> None:
        for kind in TINY_KINDS:
            make_checkpoint(kind, root / kind, size="tiny", seed=0)

    root = made_once(shared_dir, "checkpoints", make)
    return {kind: root / kind for kind in TINY_KINDS}


@pytest.fixture(scope="session")
def realtime_reference(tiny_checkpoints):
    from vibevoice_onnx.reference.loading import load_realtime

    return load_realtime(tiny_checkpoints["realtime"])


@pytest.fixture(scope="session")
def tiny_preset(tiny_checkpoints, shared_dir) -> Path:
    """An upstream-format preset for the tiny realtime checkpoint, as make-checkpoint writes it."""
    from vibevoice_onnx.reference.loading import load_realtime
    from vibevoice_onnx.reference.presets import write_synthetic_preset
    from vibevoice_onnx.text import load_tokenizer

    def make(root: Path) -> None:
        root.mkdir()
        tokenizer = load_tokenizer(tiny_checkpoints["realtime"] / "tokenizer.json")
        write_synthetic_preset(load_realtime(tiny_checkpoints["realtime"]), tokenizer, root / "synthetic.pt")

    return made_once(shared_dir, "preset", make) / "synthetic.pt"


def built_once(shared: Path, checkpoint: Path, graphs: str = "written", voice=None, tokenizer: Path | None = None,
               precision: str = "fp32") -> Path:
    """`checkpoint` built into a bundle every file of the run shares, keyed by what it is built from: the
    checkpoint, how its graphs are made (written without torch unless a test is about tracing: seconds against
    tracing's half minute, and proven equal to the traced graphs by test_writer), the tokenizer given, the voice
    imported, (path, name), and the precision: a quantized one is built beside a copy of the fp32 one, as `build`
    makes it (a traced int8 takes the traced fp32 graphs it keeps), unverified. Read-only to tests."""
    from vibevoice_onnx.checkpoints.checkpoint import Checkpoint
    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.runtime.voice_store import import_voice

    kind = Checkpoint.open(checkpoint).dims.kind
    key = "-".join([checkpoint.name, graphs, *([tokenizer.parent.name] if tokenizer else []),
                    *([voice[1]] if voice else [])])
    fp32 = None if precision == "fp32" else built_once(shared, checkpoint, graphs, voice, tokenizer)

    def make(root: Path) -> None:
        if fp32:
            copy_bundle(fp32, root / kind / "cpu_fp32")
        bundle = build_bundle(checkpoint, root, precision, tokenizer=tokenizer, write=graphs == "written")
        if voice and not fp32:  # a quantized build carries the fp32 sibling's voices
            import_voice(bundle, *voice)

    suffix = "" if precision == "fp32" else f"-{precision}"
    return made_once(shared, f"built-{key}{suffix}", make) / kind / f"cpu_{precision}"


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoints, tiny_preset, shared_dir) -> Path:
    """The tiny realtime checkpoint built into a bundle (graphs written), the synthetic voice imported. Read-only."""
    return built_once(shared_dir, tiny_checkpoints["realtime"], voice=(tiny_preset, "synthetic"))


@pytest.fixture(scope="session")
def tiny_traced_bundle(tiny_checkpoints, tiny_preset, shared_dir) -> Path:
    """tiny_bundle with its graphs traced by torch.onnx: for the tests of tracing itself. Read-only."""
    return built_once(shared_dir, tiny_checkpoints["realtime"], graphs="traced", voice=(tiny_preset, "synthetic"))


def verified_sibling(precision: str, tiny_checkpoints, tiny_bundle, shared_dir) -> Path:
    """tiny_bundle at `precision` (built from its fp32 sibling, as `build` does), verified. Treat as read-only."""
    from vibevoice_onnx.cli import main
    from vibevoice_onnx.verify.common import verify_bundle

    def make(root: Path) -> None:
        copy_bundle(tiny_bundle, root / "realtime" / "cpu_fp32")
        assert main(["build", str(tiny_checkpoints["realtime"]), "-o", str(root), "--precision", precision,
                     "--graphs", "written"]) == 0
        assert verify_bundle(root / "realtime" / f"cpu_{precision}", tiny_checkpoints["realtime"], log=lambda _: None)["passed"]

    return made_once(shared_dir, f"onnx-{precision}", make) / "realtime" / f"cpu_{precision}"


@pytest.fixture(scope="session")
def tiny_int8_bundle(tiny_checkpoints, tiny_bundle, shared_dir) -> Path:
    return verified_sibling("int8", tiny_checkpoints, tiny_bundle, shared_dir)


@pytest.fixture(scope="session")
def tiny_int8_decoder_bundle(tiny_checkpoints, tiny_bundle, shared_dir) -> Path:
    """The build for a browser's WASM (`--precision int8-decoder`): fp32 but the decoder in dynamic int8."""
    return verified_sibling("int8-decoder", tiny_checkpoints, tiny_bundle, shared_dir)


@pytest.fixture(scope="session")
def eos_early_rebuild(tiny_checkpoints, tiny_bundle, tmp_path_factory) -> tuple[Path, Path]:
    """A rebuild, over a copy of the tiny bundle, from a checkpoint whose EOS fires on the first frame.

    One build serves two tests: a rebuild keeps the voices (same model dims), and verify must judge a
    checkpoint that stops at once. Returns (checkpoint, rebuilt bundle)."""
    import numpy as np

    from vibevoice_onnx.export.build import build_bundle

    from helpers import copy_checkpoint, set_tensor

    root = tmp_path_factory.mktemp("eos-early")
    checkpoint = copy_checkpoint(tiny_checkpoints["realtime"], root / "checkpoint")
    set_tensor(checkpoint, "tts_eos_classifier.fc2.bias", np.array([12.0]))  # logit std ~1: fires at once
    previous = copy_bundle(tiny_bundle, root / "onnx" / "realtime" / "cpu_fp32")
    (previous / "stale.txt").write_text("from the old bundle")
    return checkpoint, build_bundle(checkpoint, root / "onnx", write=True)


@pytest.fixture(scope="session")
def tiny_15b_bundle(tiny_checkpoints, shared_dir) -> Path:
    """The tiny 1.5B checkpoint built into a bundle, with a generated voice sample imported. Read-only."""
    def make(root: Path) -> None:
        root.mkdir()
        write_voice_sample(root / "alice.flac")

    sample = made_once(shared_dir, "voice-sample", make) / "alice.flac"
    return built_once(shared_dir, tiny_checkpoints["1.5b"], voice=(sample, "alice"))


@pytest.fixture(scope="session")
def tiny_asr_tokenizer(shared_dir) -> Path:
    """The tiny Qwen tokenizer the ASR checkpoint (which ships none) is built with."""
    from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer

    def make(root: Path) -> None:
        root.mkdir(parents=True)
        build_tokenizer("tiny")[0].save(str(root / "tokenizer.json"))

    return made_once(shared_dir, "asr-tokenizer", make) / "tokenizer.json"


@pytest.fixture(scope="session")
def tiny_asr_bundle(tiny_checkpoints, tiny_asr_tokenizer, shared_dir) -> Path:
    """The tiny ASR checkpoint built into a bundle with the tiny tokenizer. Read-only."""
    return built_once(shared_dir, tiny_checkpoints["asr"], tokenizer=tiny_asr_tokenizer)


@pytest.fixture(scope="session")
def tiny_streaming_bundle(tiny_checkpoints, shared_dir) -> Path:
    """A tiny ASR-Streaming bundle (the 1.5B variant, fp32: usable unverified), for live transcription. Read-only."""
    return built_once(shared_dir, tiny_checkpoints["asr-streaming"])


def write_voice_sample(path: Path, seconds: float = 2.5, rate: int = 16000, channels: int = 2, pitch: float = 180.0) -> Path:
    """A voice-like test signal (harmonics, vibrato, breath noise) in any format soundfile writes."""
    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * pitch * t + 2.0 * np.sin(2 * np.pi * 4.0 * t)
    voice = sum(np.sin(k * phase) / k for k in range(1, 5)) * 0.2
    noise = np.random.default_rng(int(pitch)).standard_normal((len(t), channels)) * 0.02
    sf.write(str(path), (voice[:, None] * np.linspace(1.0, 0.6, channels)[None] + noise).astype(np.float32), rate)
    return path


def copy_bundle(bundle: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(bundle, dst)
    return dst


@pytest.fixture(scope="module")
def repos(tiny_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Repository folders: the tiny realtime, 1.5B and ASR checkpoints (the ASR one ships its tokenizer, the TTS ones
    none), the Qwen tokenizers the TTS ones need, and a repository that is no VibeVoice checkpoint."""
    import json

    from hub_standin import ASR_ID, REALTIME_ID, TTS15B_ID, repo_folder, tokenizer_folder

    root = tmp_path_factory.mktemp("repos")
    other = root / "bert"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    return {
        REALTIME_ID: repo_folder(tiny_checkpoints["realtime"], root / "realtime"),
        TTS15B_ID: repo_folder(tiny_checkpoints["1.5b"], root / "tts15b"),
        ASR_ID: repo_folder(tiny_checkpoints["asr"], root / "asr", keep_tokenizer=True),
        "Qwen/Qwen2.5-0.5B": tokenizer_folder(tiny_checkpoints["realtime"], root / "qwen05"),
        "Qwen/Qwen2.5-1.5B": tokenizer_folder(tiny_checkpoints["1.5b"], root / "qwen15"),
        "google-bert/bert-base-uncased": other,
    }


@pytest.fixture(scope="module")
def hub(repos, tiny_preset):
    from hub_standin import REALTIME_ID, StandInHub

    with StandInHub() as hub:
        for repo_id, folder in repos.items():
            hub.add_repo(repo_id, folder)
        hub.add_repo("someone/private-model", repos[REALTIME_ID], access="private")
        hub.add_repo("someone/gated-model", repos[REALTIME_ID], access="gated")
        hub.add_file("/voices/synthetic.pt", tiny_preset)
        hub.add_file("/voices/again.pt", tiny_preset)
        yield hub
