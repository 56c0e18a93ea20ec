"""The repetition guard of ASR and ASR-Streaming greedy decoding (generation.repetition): what it takes for a
loop and what it leaves alone, and on the tiny checkpoints (whose greedy decoding falls into loops on some clips)
that it cuts a loop back, resumes decoding from a correctly rewound cache, and says so in every output."""

from __future__ import annotations

import io
import json
import shutil
import threading

import numpy as np
import pytest

from vibevoice_onnx.generation.repetition import (MAX_PERIOD, MIN_REPEATS, MIN_SPAN, Loop, RepetitionGuard,
                                                  Thresholds, find_loop)

PHRASE = [11, 12, 13, 14, 15]  # a few distinct tokens: what comes before a repetition


def loop_ends(tokens: list[int]) -> list[int]:
    """The lengths at which a prefix of `tokens` ends in a loop (what the guard would have cut)."""
    return [n for n in range(1, len(tokens) + 1) if find_loop(tokens[:n])]


# ---- the detector ----

def test_the_thresholds_are_a_period_repeated_8_times_over_48_tokens_or_more():
    thresholds = Thresholds()
    assert (MAX_PERIOD, MIN_REPEATS, MIN_SPAN) == (64, 8, 48)
    assert [thresholds.needed(p) for p in (1, 2, 3, 4, 6, 7, 12, 64)] == [48, 48, 48, 48, 48, 56, 96, 512]


@pytest.mark.parametrize("period", [1, 2, 3, 6, 7, 12, 64])
def test_a_loop_is_found_once_it_crosses_the_threshold_and_cut_after_its_first_occurrence(period):
    unit = list(range(100, 100 + period))
    need = Thresholds().needed(period)
    tokens = PHRASE + unit * (need // period)
    assert find_loop(tokens[:-1]) is None  # one token short of the threshold: nothing yet
    loop = find_loop(tokens)
    assert loop == Loop(len(PHRASE), period, len(tokens))
    assert loop.keep == len(PHRASE) + period and tokens[:loop.keep] == PHRASE + unit
    assert loop.as_dict() == {"at_token": loop.keep, "period": period, "repeats": need / period,
                              "tokens_cut": need - period}


def test_the_smallest_period_is_reported_and_a_run_is_walked_back_to_its_start():
    tokens = PHRASE + [7, 8] * 40  # also periodic with period 4, 6 ...
    loop = find_loop(tokens)
    assert (loop.start, loop.period, loop.keep) == (len(PHRASE), 2, len(PHRASE) + 2)
    partial = PHRASE + [9] + [7, 8, 9] * 16  # the run starts one token before the whole repeats
    assert find_loop(partial).start == len(PHRASE)


@pytest.mark.parametrize("tokens", [
    PHRASE + [20, 21] * 4 + PHRASE,  # "no, no, no, no,"
    PHRASE + list(range(30, 40)) * 4,  # a ten-token chorus line sung four times
    PHRASE + list(range(30, 42)) * 7,  # a twelve-token line seven times: 84 tokens, one repeat short
    PHRASE + [20] * 47,  # one token 47 times: one short of the span
    PHRASE + [20, 21] * 23 + [20],  # a two-token "no," 23 times and a half
    [t for n in range(1, 60) for t in (200 + n, 199)],  # counting "1, 2, 3 ...": each item differs
    list(range(300, 500)),  # plain text
    PHRASE + list(range(40, 105)) * 9,  # a period of 65 tokens: longer than MAX_PERIOD
], ids=["no-no-no", "chorus", "seven-lines", "47-tokens", "23-pairs", "counting", "text", "period-65"])
def test_genuine_repetition_below_the_thresholds_is_no_loop(tokens):
    assert loop_ends(tokens) == []


def test_the_guard_bans_the_looping_token_where_it_cut_and_stops_after_three_loops_in_one_place():
    guard = RepetitionGuard()
    tokens = PHRASE + [7] * 48
    loop = guard.check(tokens)
    assert loop.keep == len(PHRASE) + 1 and guard.banned(loop.keep) == {7} and not guard.stopped
    assert guard.banned(loop.keep + 1) == set()
    for more in range(3):  # it falls back into loops near the same place
        tokens = tokens[:loop.keep] + [8 + more] + [7] * 48
        loop = guard.check(tokens)
    assert guard.stopped and len(guard.report.loops) == 4
    assert guard.report.as_dict()["recovered"] is False and guard.report.detected


def test_loops_far_apart_are_each_recovered_from():
    guard = RepetitionGuard(Thresholds(near=16))
    tokens = []
    for place in range(5):
        tokens = tokens + list(range(1000 + 100 * place, 1000 + 100 * place + 40)) + [place] * 48
        loop = guard.check(tokens)
        tokens = tokens[:loop.keep]
    assert not guard.stopped and guard.report.recovered and len(guard.report.loops) == 5
    assert "recovered" in guard.report.describe() and guard.report.describe().count("1-token period x48") == 5


# ---- on the tiny ASR checkpoint ----

LOOPING = dict(samples=72000, step=0.05, seed=0, max_new_tokens=200)  # greedy decoding loops at token 176


def clip(samples: int, step: float) -> np.ndarray:
    return (0.3 * np.sin(np.arange(samples) * step)).astype(np.float32)


@pytest.fixture(scope="module")
def transcriber(tiny_asr_bundle):
    from vibevoice_onnx.runtime.asr import Transcriber

    return Transcriber(tiny_asr_bundle, force=True)


@pytest.fixture(scope="module")
def looping(transcriber):
    """The looping clip transcribed unguarded and guarded."""
    audio, options = clip(LOOPING["samples"], LOOPING["step"]), dict(seed=LOOPING["seed"],
                                                                      max_new_tokens=LOOPING["max_new_tokens"])
    return audio, [transcriber.transcribe(audio, 24000, repetition_guard=guard, **options) for guard in (False, True)]


def test_an_unguarded_transcription_fills_its_budget_with_a_loop(looping):
    _, (unguarded, _) = looping
    assert len(unguarded.tokens) == LOOPING["max_new_tokens"] and loop_ends(unguarded.tokens)
    assert unguarded.repetition.as_dict() == {"guard": False, "detected": False, "recovered": False, "loops": []}


def test_the_guard_cuts_the_loop_back_and_decodes_on_from_a_rewound_cache(transcriber, looping):
    from vibevoice_onnx.generation.asr import audio_embeddings, forced_logits
    from vibevoice_onnx.transcription import build_asr_prompt

    audio, (unguarded, guarded) = looping
    report = guarded.repetition.as_dict()
    assert report["guard"] and report["detected"] and report["recovered"], report
    (loop,) = guarded.repetition.loops
    cut = loop.keep
    assert unguarded.tokens[loop.start:loop.end] == unguarded.tokens[loop.start:loop.start + loop.period] * int(loop.repeats)
    assert guarded.tokens[:cut] == unguarded.tokens[:cut]  # unguarded decoding up to the cut, the first copy kept
    assert guarded.tokens[cut] != unguarded.tokens[cut]  # the banned token that restarted the loop
    assert loop_ends(guarded.tokens) == [] and len(guarded.tokens) == LOOPING["max_new_tokens"]
    assert "repetition loop detected" in guarded.note and "recovered" in guarded.note
    # Teacher-forced in one pass (no cache rewound): every pick is greedy's on the tokens kept, but the banned one.
    samples = transcriber.load(audio, 24000)
    embeddings = audio_embeddings(transcriber.backend, samples, np.random.default_rng(LOOPING["seed"]))
    logits = forced_logits(transcriber.backend, build_asr_prompt(transcriber.tokenizer, len(samples)), embeddings,
                           guarded.tokens)
    picks = logits.argmax(axis=1)
    assert [i for i, (pick, token) in enumerate(zip(picks, guarded.tokens)) if pick != token] == [cut]
    assert picks[cut] == unguarded.tokens[cut] and np.argsort(logits[cut])[-2] == guarded.tokens[cut]


def test_a_batched_transcription_recovers_as_it_does_alone(transcriber, looping):
    audio, (_, alone) = looping
    batch = transcriber.batch(max_streams=2)
    results = [None, None]
    other = clip(48000, 0.02)

    def run(k):
        results[k] = transcriber.transcribe(*((audio, 24000) if k == 0 else (other, 24000)), seed=LOOPING["seed"] if k == 0 else 1,
                                            max_new_tokens=LOOPING["max_new_tokens"], batch=batch)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results[0].tokens == alone.tokens and results[0].repetition == alone.repetition
    assert max(batch.batcher.batches["lm_step"]) == 2


@pytest.mark.parametrize("step,period,repeats", [(0.01, 3, 7), (0.05, 1, 33)])
def test_a_repetition_below_the_threshold_is_left_as_greedy_decoding_gives_it(transcriber, step, period, repeats):
    audio = clip(72000, step)
    guarded, unguarded = (transcriber.transcribe(audio, 24000, max_new_tokens=120, mean_latents=True,
                                                 repetition_guard=guard) for guard in (True, False))
    tokens = unguarded.tokens
    run = next(i for i in range(len(tokens)) if tokens[i:i + period * repeats] == tokens[i:i + period] * repeats)
    assert tokens[run:run + period * (repeats + 1)] != tokens[run:run + period] * (repeats + 1)  # the whole run
    assert guarded.tokens == unguarded.tokens and not guarded.repetition.detected and guarded.repetition.guard


# ---- its report in every output ----

@pytest.fixture(scope="module")
def looping_wav(looping, tmp_path_factory):
    import soundfile as sf

    path = tmp_path_factory.mktemp("looping") / "loop.wav"
    sf.write(path, looping[0], 24000, subtype="FLOAT")
    return path


def test_transcribe_cli_warns_and_writes_the_report_into_its_json(tiny_asr_bundle, looping, looping_wav, capsys):
    from vibevoice_onnx.cli import main

    _, (unguarded, guarded) = looping
    common = ["transcribe", str(tiny_asr_bundle), str(looping_wav), "--seed", str(LOOPING["seed"]),
              "--max-new-tokens", str(LOOPING["max_new_tokens"]), "--force"]
    assert main(common) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["repetition"] == guarded.repetition.as_dict()
    assert f"warning: loop.wav: " in err and "repetition loop detected (2-token period" in err
    assert main(common + ["--no-repetition-guard"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["repetition"] == unguarded.repetition.as_dict() and "repetition" not in err


@pytest.mark.parametrize("fmt", ["json", "verbose_json"])
def test_the_server_answers_with_the_report(tiny_asr_bundle, looping, looping_wav, tmp_path_factory, fmt):
    pytest.importorskip("fastapi")
    pytest.importorskip("av")
    from fastapi.testclient import TestClient

    from vibevoice_onnx.serve import Models, Settings, create_app

    _, (unguarded, guarded) = looping
    bundle = shutil.copytree(tiny_asr_bundle, tmp_path_factory.mktemp("served") / "asr")
    with TestClient(create_app(Models.open([bundle]), Settings())) as client:
        def ask(**fields):
            files = {"file": ("loop.wav", io.BytesIO(looping_wav.read_bytes()), "audio/wav")}
            data = {"model": "whisper-1", "seed": str(LOOPING["seed"]), "max_new_tokens": str(LOOPING["max_new_tokens"]),
                    "response_format": fmt, **fields}
            response = client.post("/v1/audio/transcriptions", data=data, files=files)
            assert response.status_code == 200, response.text
            return response.json()

        body = ask()
        assert body["repetition"] == guarded.repetition.as_dict() and "repetition loop" in body["warning"]
        assert ask(repetition_guard="false")["repetition"] == unguarded.repetition.as_dict()


# ---- ASR-Streaming: each chunk guarded on its own ----

@pytest.fixture(scope="module")
def streaming(tmp_path_factory):
    """The tiny ASR-Streaming checkpoint on the PyTorch reference (its greedy chunks fall into one-token loops
    on a slow sine), its tokenizer and geometry, and three windows."""
    from vibevoice_onnx.checkpoints.configs import streaming_geometry
    from vibevoice_onnx.checkpoints.synthetic import make_checkpoint
    from vibevoice_onnx.generation.asr_streaming import split_windows
    from vibevoice_onnx.reference.asr import load_asr
    from vibevoice_onnx.text import load_tokenizer

    root = tmp_path_factory.mktemp("asr-streaming") / "1.5b"
    make_checkpoint("asr-streaming", root, size="tiny", seed=3, variant="1.5b")
    geometry = streaming_geometry(json.loads((root / "preprocessor_config.json").read_text()))
    windows = list(split_windows(clip(3 * geometry.chunk_samples, 0.002), geometry))
    return load_asr(root), load_tokenizer(root / "tokenizer.json"), geometry, windows, root


def test_a_streaming_chunk_is_cut_at_its_loop_and_the_session_goes_on_from_the_tokens_kept(streaming):
    from vibevoice_onnx.generation.asr_streaming import StreamingSession, forced_logits

    backend, tokenizer, geometry, windows, _ = streaming
    sessions = [StreamingSession(backend, tokenizer, geometry, repetition_guard=guard) for guard in (False, True)]
    unguarded, guarded = ([session.chunk(window) for window in windows] for session in sessions)
    assert [c.stop_reason for c in unguarded] == ["max_tokens"] * 3  # 256 tokens each, looping
    assert all(loop_ends(c.tokens) for c in unguarded) and all("repetition" not in c.message() for c in unguarded)
    first = guarded[0]
    loops = first.repetition.loops
    assert first.tokens[:loops[0].keep] == unguarded[0].tokens[:loops[0].keep]
    # the tiny model falls back into a loop after each ban: stopped after three recoveries near one place
    assert first.stop_reason == "repetition" and len(loops) == 4 and len(first.tokens) == loops[-1].keep
    assert first.message()["repetition"] == {"guard": True, "detected": True, "recovered": False,
                                             "loops": [loop.as_dict() for loop in loops]}
    assert all(c.repetition.detected and len(c.tokens) < 64 for c in guarded)
    # Teacher-forced over the whole session in one pass: each chunk's picks are greedy's on what the cache was
    # given (the kept tokens only, then <|text_chunk_end|>), but where a token was banned after a cut.
    for chunk, logits in zip(guarded, forced_logits(backend, tokenizer, geometry, windows, guarded)):
        picks = logits.argmax(axis=1)
        differ = {i for i, (pick, token) in enumerate(zip(picks, chunk.tokens)) if pick != token}
        assert differ and differ <= {loop.keep for loop in chunk.repetition.loops}, (differ, chunk.repetition.loops)


def test_the_onnx_streaming_runtime_and_transcribe_stream_report_each_looping_chunk(streaming, tmp_path, capsys):
    import soundfile as sf

    from vibevoice_onnx.cli import main
    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.runtime.asr_streaming import StreamingTranscriber

    _, _, geometry, _, checkpoint = streaming
    bundle = build_bundle(checkpoint, tmp_path / "onnx", write=True)  # the runtime is the subject: graphs written
    audio = clip(3 * geometry.chunk_samples, 0.002)
    live = StreamingTranscriber(bundle, mean_latents=True, force=True, warm=False)
    live.feed(audio, 24000)
    live.finish()
    # (its tokens are not compared with the reference's: after a ban the tiny model's next picks are near ties)
    assert [c.stop_reason for c in live.chunks] == ["repetition"] * 3
    assert all(loop_ends(c.tokens) == [] and c.message()["repetition"] == c.repetition.as_dict() for c in live.chunks)
    report = live.transcript().repetition.as_dict()
    assert report["detected"] and not report["recovered"] and {loop["chunk"] for loop in report["loops"]} == {0, 1, 2}
    assert "repetition loops detected" in live.transcript().note
    sf.write(tmp_path / "loop.wav", audio, 24000, subtype="FLOAT")
    assert main(["transcribe", "--stream", str(bundle), str(tmp_path / "loop.wav"), "--mean-latents", "--format", "json",
                 "--force"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == [c.message() for c in live.chunks]
    assert [line.split(":")[0] for line in err.splitlines() if line.startswith("warning:")] == ["warning"] * 3
    assert main(["transcribe", "--stream", str(bundle), str(tmp_path / "loop.wav"), "--mean-latents", "--format", "json",
                 "--force", "--no-repetition-guard"]) == 0
    out, err = capsys.readouterr()
    assert all("repetition" not in json.loads(line) for line in out.splitlines()) and "warning:" not in err
