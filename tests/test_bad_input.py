"""Every bad input gets one sentence, the right exit status, no traceback, and leaves nothing behind.

Each case names the command, its exit status (2: could not run on this input; 1: a judged outcome, such as
`inspect` finding a checkpoint unusable), a fragment of the message, and the files the command may leave:
the work folder is listed before and after, hidden files included, and must be unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vibevoice_onnx.cli import main

from conftest import copy_bundle
from helpers import copy_checkpoint, eventually, set_config, set_tensor

SYS_UNWRITABLE = Path("/sys/vibevoice-onnx-test")  # not even root may create files in sysfs


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@dataclass
class Work:
    """The case's folder, with lazily made copies of the tiny checkpoint and bundle."""

    root: Path
    checkpoints: dict
    bundle_source: Path
    preset: Path

    def checkpoint(self) -> Path:
        return copy_checkpoint(self.checkpoints["realtime"], self.root / "ckpt")

    def bundle(self) -> Path:
        return copy_bundle(self.bundle_source, self.root / "bundle")

    def file(self, name: str = "a-file", content: str = "not a folder") -> Path:
        (self.root / name).write_text(content)
        return self.root / name


@dataclass
class Case:
    name: str
    setup: Callable[[Work], list]  # -> the command line
    code: int
    message: str
    context: Callable[[Work], object] | None = None  # a context manager around the run (e.g. a read-only folder)
    keeps: list[str] = field(default_factory=list)  # paths the command may add (success cases)


def host_with(bundle: Path, **values) -> None:
    host = load_file(bundle / "host.safetensors")
    host.update({k: np.asarray(v, np.float32) for k, v in values.items()})
    save_file(host, str(bundle / "host.safetensors"))


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def edit_manifest(bundle: Path, edit: Callable[[dict], object]) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_text(json.dumps(edit(manifest)))


def _with_tensor(name, value):
    def setup(w: Work):
        ckpt = w.checkpoint()
        set_tensor(ckpt, name, value)
        return ckpt
    return setup


def _with_config(section, key, value):
    def setup(w: Work):
        ckpt = w.checkpoint()
        set_config(ckpt, section, key, value)
        return ckpt
    return setup


def _speak(*options):
    return lambda w: ["speak", w.bundle(), "Hello there.", "--max-frames", "3", "-o", w.root / "out.wav", *options]


def _bundle_then(change, command=("speak",), extra=("Hello.", "--max-frames", "2")):
    def setup(w: Work):
        bundle = w.bundle()
        change(bundle)
        out = ["-o", w.root / "out.wav"] if command[0] == "speak" else []
        return [*command, bundle, *(extra if command[0] == "speak" else ()), *out]
    return setup


@contextmanager
def read_only(folder: Path):
    """A folder nobody can write to, root included (chattr +i), undone afterwards."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot make a folder read-only for root here (no chattr +i)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def _latents(values):
    def setup(w: Work):
        np.save(w.root / "z.npy", np.asarray(values, np.float32))
        return ["decode", w.bundle(), w.root / "z.npy", "-o", w.root / "d.wav"]
    return setup


CASES = [
    # -- checkpoints: non-finite values, broken configs -------------------------------------------------
    Case("inspect: NaN latent scaling factor", lambda w: ["inspect", _with_tensor("model.speech_scaling_factor", np.nan)(w)],
         1, "model.speech_scaling_factor (NaN)"),
    Case("inspect: infinite type embedding", lambda w: ["inspect", _with_tensor("model.tts_input_types.weight", np.full((2, 64), np.inf))(w)],
         1, "model.tts_input_types.weight (infinity)"),
    Case("build: NaN latent scaling factor", lambda w: ["build", _with_tensor("model.speech_scaling_factor", np.nan)(w), "-o", w.root / "onnx"],
         2, "holds non-finite values in model.speech_scaling_factor (NaN)"),
    Case("build: NaN EOS bias", lambda w: ["build", _with_tensor("tts_eos_classifier.fc2.bias", [np.nan])(w), "-o", w.root / "onnx"],
         2, "tts_eos_classifier.fc2.bias (NaN)"),
    Case("inspect: null sub-config", lambda w: ["inspect", _with_config(None, "decoder_config", None)(w)],
         2, "decoder_config must be a JSON object, found null"),
    Case("inspect: zero attention heads", lambda w: ["inspect", _with_config("decoder_config", "num_attention_heads", 0)(w)],
         2, "decoder_config.num_attention_heads must be a whole number of at least 1, found the number 0"),
    Case("inspect: heads that do not divide the width", lambda w: ["inspect", _with_config("decoder_config", "num_attention_heads", 5)(w)],
         2, "hidden_size 64 is not divisible by num_attention_heads 5"),
    Case("inspect: layer count that is a string", lambda w: ["inspect", _with_config("decoder_config", "num_hidden_layers", "many")(w)],
         2, "num_hidden_layers must be a whole number of at least 1, found a string"),
    Case("inspect: stage depths that do not fit the ratios", lambda w: ["inspect", _with_config("acoustic_tokenizer_config", "encoder_depths", "1-1")(w)],
         2, "has 6 ratios but 2 stage depths"),
    Case("build: a layout error creates nothing", lambda w: ["build", _with_tensor_removed(w), "-o", w.root / "onnx"],
         2, "does not match the realtime layout: 1 missing (model.tts_input_types.weight)"),
    # -- output locations ------------------------------------------------------------------------------
    Case("build: output root below a file", lambda w: ["build", w.checkpoints["realtime"], "-o", w.file() / "onnx"],
         2, "creating the output folder failed: not a directory"),
    Case("build: output root that cannot be created", lambda w: ["build", w.checkpoints["realtime"], "-o", SYS_UNWRITABLE],
         2, "creating the output folder failed: operation not permitted"),
    Case("make-checkpoint: negative seed", lambda w: ["make-checkpoint", "realtime", w.root / "c", "--seed", "-1"],
         2, "argument --seed: must be a whole number from 0 to"),
    Case("make-checkpoint: output is a file", lambda w: ["make-checkpoint", "1.5b", w.file()],
         2, "is a file; choose a new output directory"),
    Case("make-checkpoint: output below a file", lambda w: ["make-checkpoint", "1.5b", w.file() / "c"],
         2, "creating the output folder failed: not a directory"),
    Case("speak: -o names a directory", lambda w: ["speak", w.bundle(), "Hi.", "-o", _mkdir(w.root / "adir")],
         2, "adir: is a directory; give a file name"),
    Case("speak: -o in a folder nobody may write", lambda w: ["speak", w.bundle(), "Hi.", "--max-frames", "2", "-o", Path("/sys/speech.wav")],
         2, "writing the WAV file failed: permission denied"),
    Case("speak: --save-latents names a directory", lambda w: [*_speak()(w), "--save-latents", _mkdir(w.root / "zdir")],
         2, "zdir: is a directory"),
    Case("decode: -o names a directory", lambda w: [*_latents(np.zeros((2, 64)))(w)[:-1], _mkdir(w.root / "ddir")],
         2, "ddir: is a directory"),
    Case("voices import: voices folder nobody may write", lambda w: ["voices", "import", w.bundle(), w.preset, "--name", "again"],
         2, "writing the voice failed: ", context=lambda w: read_only(w.root / "bundle" / "voices")),
    # -- numeric options -------------------------------------------------------------------------------
    Case("speak: negative seed", _speak("--seed", "-1"), 2, "argument --seed: must be a whole number from 0 to 9223372036854775807, got '-1'"),
    Case("speak: seed that is not a number", _speak("--seed", "abc"), 2, "argument --seed: must be a whole number"),
    Case("speak: negative threads", _speak("--threads", "-3"), 2, "argument --threads: must be a whole number from 1 to 1024"),
    Case("speak: zero threads", _speak("--threads", "0"), 2, "argument --threads: must be a whole number from 1 to 1024"),
    Case("speak: NaN CFG scale", _speak("--cfg-scale", "nan"), 2, "argument --cfg-scale: must be a number from 0 to 20, got 'nan'"),
    Case("speak: negative CFG scale", _speak("--cfg-scale", "-1"), 2, "argument --cfg-scale: must be a number from 0 to 20"),
    Case("speak: CFG scale far outside any use", _speak("--cfg-scale", "1e30"), 2, "argument --cfg-scale: must be a number from 0 to 20"),
    Case("speak: zero steps", _speak("--steps", "0"), 2, "argument --steps: must be a whole number from 1 to 999"),
    Case("speak: more steps than the schedule has", _speak("--steps", "1000"), 2, "argument --steps: must be a whole number from 1 to 999"),
    Case("speak: zero frames", _speak("--max-frames", "0"), 2, "argument --max-frames: must be a whole number of at least 1"),
    Case("decode: latents with NaN", _latents([[np.nan] * 64] * 2), 2, "latents must hold finite floating-point values"),
    Case("decode: latents of the wrong width", _latents(np.zeros((2, 32))), 2, "latents must have shape [frames, 64], got [2, 32]"),
    # -- values that turn into NaN at run time -----------------------------------------------------------
    Case("speak: a zero latent scale makes infinite latents", _bundle_then(lambda b: host_with(b, speech_scaling_factor=0.0)),
         2, "frame 0: the decoded audio holds NaN or infinity, so it was not used or written"),
    Case("speak: NaN latent scale in the bundle", _bundle_then(lambda b: host_with(b, speech_scaling_factor=np.nan)),
         2, "host tensor speech_scaling_factor holds NaN or infinity"),
    # -- damaged bundles ---------------------------------------------------------------------------------
    Case("speak: truncated graph", _bundle_then(lambda b: truncate(b / "lower_lm.onnx")),
         2, "lower_lm.onnx: this bundle is damaged: onnxruntime cannot load the graph"),
    Case("verify: truncated graph", _bundle_then(lambda b: truncate(b / "diffusion_head_step.onnx"), command=("verify",)),
         2, "diffusion_head_step.onnx: this bundle is damaged: onnxruntime cannot load the graph"),
    Case("speak: truncated host tensors", _bundle_then(lambda b: truncate(b / "host.safetensors")),
         2, "host.safetensors: this bundle is damaged: the host tensors cannot be read"),
    Case("voices list: manifest that is JSON but not an object", _bundle_then(lambda b: edit_manifest(b, lambda m: [m]), command=("voices", "list")),
         2, "this bundle is damaged: the manifest must be a JSON object, found list"),
    Case("speak: manifest naming a file outside the bundle",
         _bundle_then(lambda b: edit_manifest(b, lambda m: m["graphs"]["lower_lm"].update(file="../../etc/passwd") or m)),
         2, "names '../../etc/passwd' as the file of graph 'lower_lm', which is not a plain file name"),
    Case("speak: manifest without graphs", _bundle_then(lambda b: edit_manifest(b, lambda m: {**m, "graphs": None})),
         2, "the manifest has no valid 'graphs' (an object expected)"),
    Case("speak: manifest of an unknown kind", _bundle_then(lambda b: edit_manifest(b, lambda m: {**m, "model_kind": "tts-9000"})),
         2, "has an unknown model_kind 'tts-9000'"),
]


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _with_tensor_removed(w: Work) -> Path:
    ckpt = w.checkpoint()
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.tts_input_types.weight"]
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    return ckpt


@pytest.fixture
def work(tmp_path, tiny_checkpoints, tiny_bundle, tiny_preset) -> Work:
    return Work(tmp_path, tiny_checkpoints, tiny_bundle, tiny_preset)


def run_main(argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:  # argparse reports bad option values with exit status 2
        return e.code


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, work: Work, capsys):
    argv = case.setup(work)
    if any(str(a).startswith("/sys/") for a in argv) and not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs here to stand for a folder nobody may write")
    capsys.readouterr()
    before = listing(work.root)
    context = case.context(work) if case.context else None
    if context is not None:
        with context:
            code = run_main(argv)
    else:
        code = run_main(argv)
    out, err = capsys.readouterr()
    assert code == case.code, err
    assert case.message in (err if code == 2 else out), out + err  # a judged outcome is a report on stdout
    assert "Traceback" not in err
    if code == 2:
        assert len([line for line in err.splitlines() if "error:" in line]) == 1, err  # one sentence, not a cascade
    assert listing(work.root) == before | set(case.keeps)
    assert not SYS_UNWRITABLE.exists()


def test_a_build_removes_what_killed_builds_left_and_what_it_made(work, monkeypatch, capsys):
    """A stale partial of a killed build goes (and is reported); a failing build leaves no kind folder."""
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.export import build as build_module

    from helpers import dead_pid

    dead = dead_pid()
    stale = work.root / "onnx" / "realtime" / f".cpu_fp32.partial-{dead}-abc123"  # a killed build's
    (stale / "voices").mkdir(parents=True)
    (stale / "lower_lm.onnx").write_bytes(b"half a graph")
    live = work.root / "onnx" / "realtime" / f".cpu_int8.partial-{os.getpid()}-def456"  # a live writer's
    live.mkdir()

    def failing_export(spec, out_dir, log=print, fuse=True):
        raise VibeVoiceError("simulated export failure")

    monkeypatch.setattr(build_module, "export_graph", failing_export)
    assert run_main(["build", work.checkpoints["realtime"], "-o", work.root / "onnx"]) == 2
    err = capsys.readouterr().err
    assert f"removed {stale}, left by an earlier run that was killed (process {dead})" in err
    assert "simulated export failure" in err
    assert listing(work.root / "onnx") == {"realtime", f"realtime/{live.name}"}

    shutil.rmtree(work.root / "onnx")
    assert run_main(["build", work.checkpoints["realtime"], "-o", work.root / "onnx"]) == 2
    assert not (work.root / "onnx").exists()  # the folders this build created went with it


def run_cli(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vibevoice_onnx.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def partials(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".partial-" in p.name]


def test_raw_pcm_into_a_reader_that_stops_early_exits_quietly(tiny_bundle):
    proc = run_cli("speak", tiny_bundle, "Hello there.", "--seed", "1", "--max-frames", "200", "--raw")
    assert len(proc.stdout.read(100)) == 100
    proc.stdout.close()  # like `| head -c 100`
    err = proc.stderr.read().decode()
    assert proc.wait() == 128 + signal.SIGPIPE
    assert "Traceback" not in err and "Exception ignored" not in err and "error" not in err


def test_sigterm_during_speak_leaves_no_partial_wav(tiny_bundle, tmp_path):
    proc = run_cli("speak", tiny_bundle, "Hello there.", "--seed", "1", "--max-frames", "100000", "-o", tmp_path / "out.wav")
    assert eventually(lambda: bool(partials(tmp_path)) and os.path.getsize(partials(tmp_path)[0]) > 100_000, 120,
                      every=0.05), "timed out"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 128 + signal.SIGTERM
    assert "terminated" in proc.stderr.read().decode()
    assert listing(tmp_path) == set()


def test_sigterm_during_build_removes_the_partial_bundle_and_new_folders(tiny_checkpoints, tmp_path):
    proc = run_cli("build", tiny_checkpoints["realtime"], "-o", tmp_path / "onnx")
    assert eventually(lambda: any(d.is_dir() and any(d.glob("*.onnx")) for d in partials(tmp_path)), 120,
                      every=0.05), "timed out"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 128 + signal.SIGTERM
    err = proc.stderr.read().decode()
    assert "terminated" in err and "Traceback" not in err
    assert listing(tmp_path) == set()


def test_a_file_size_limit_mid_write_is_one_sentence_and_no_partial(tiny_bundle, tmp_path):
    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # Python ignores SIGXFSZ: writes fail instead

    proc = run_cli("speak", tiny_bundle, "Hello there.", "--seed", "1", "--max-frames", "12", "-o", tmp_path / "out.wav",
                   preexec_fn=limit)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode == 2, err
    assert "out.wav: writing the WAV file failed" in err and "Traceback" not in err
    assert listing(tmp_path) == set()
