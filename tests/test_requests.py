"""One request layer (vibevoice_onnx.requests) under three front-ends: the same bad request gets the same sentence
from the command line, the HTTP server and a batch job's item, each naming the field as its user writes it."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")  # the server's front-end: the serve extra

from fastapi.testclient import TestClient  # noqa: E402

from vibevoice_onnx.cli import EXIT_ERROR, main  # noqa: E402
from vibevoice_onnx.cluster.workers import SynthesisWorker  # noqa: E402
from vibevoice_onnx.serve import Models, Settings, create_app  # noqa: E402

from conftest import copy_bundle, write_voice_sample  # noqa: E402

THREE = "Speaker 1: Hello there.\nSpeaker 2: I am fine.\nSpeaker 3: Good."


def cli_error(capsys, tmp_path, bundle, *args) -> str:
    code = main(["speak", str(bundle), *map(str, args), "--max-frames", "2", "-o", str(tmp_path / "x.wav")])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR and err.startswith("error: ") and "Traceback" not in err, err
    assert not (tmp_path / "x.wav").exists()
    return err.strip().removeprefix("error: ")


def http_error(bundle, body: dict, param: str) -> str:
    with TestClient(create_app(Models.open([bundle]), Settings())) as client:
        response = client.post("/v1/audio/speech", json={"model": "tts-1", "max_frames": 2, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    return response.json()["error"]["message"]


def worker(bundle, tmp_path) -> SynthesisWorker:
    """A batch job's worker, run as Ray runs it but in this process."""
    made = SynthesisWorker(str(bundle), str(tmp_path / "job"))
    made.folder.prepare()
    return made


def item_error(bundle, tmp_path, item: dict) -> str:
    row = worker(bundle, tmp_path).run({"id": "one", "max_frames": 2, **item})
    assert row.status == "error" and row.output is None
    return row.error


def test_an_unknown_voice_reads_the_same_from_every_front_end(tiny_bundle, tmp_path, capsys):
    said = "{}: the model has no voice 'nobody' (available: synthetic)"
    files = ", and it is no voice file or http(s) URL"  # the server reads no client's files: it says nothing of them
    assert cli_error(capsys, tmp_path, tiny_bundle, "Hello.", "--voice", "nobody") == said.format("--voice") + files
    assert http_error(tiny_bundle, {"input": "Hello.", "voice": "nobody"}, "voice") == said.format("voice")
    assert item_error(tiny_bundle, tmp_path, {"text": "Hello.", "voice": "nobody"}) == said.format('"voice"') + files


def test_a_speaker_without_a_voice_reads_the_same_from_every_front_end(tiny_15b_bundle, tmp_path, capsys):
    said = "Speaker 3 speaks in the script but has no voice: add {}"
    assert cli_error(capsys, tmp_path, tiny_15b_bundle, THREE, "--speaker", "1=alice", "--speaker", "2=alice") == \
        said.format("--speaker 3=VOICE")
    assert http_error(tiny_15b_bundle, {"input": THREE, "voice": "alice,alice"}, "voice") == \
        said.format("a voice for Speaker 3 to 'voice' (comma-separated, in speaker order)")
    assert item_error(tiny_15b_bundle, tmp_path, {"script": THREE, "speakers": {"1": "alice", "2": "alice"}}) == \
        said.format('"speakers": {"3": VOICE}')


def test_a_cfg_scale_out_of_range_reads_the_same_from_every_front_end(tiny_bundle, tmp_path, capsys):
    said = "{} must be a number from 0 to 20, got 1000000000.0"
    assert http_error(tiny_bundle, {"input": "Hello.", "cfg_scale": 1e9}, "cfg_scale") == said.format("cfg_scale")
    assert item_error(tiny_bundle, tmp_path, {"text": "Hello.", "cfg_scale": 1e9}) == said.format('"cfg_scale"')
    with pytest.raises(SystemExit) as stopped:  # the command line refuses it as it parses, with its usage
        main(["speak", str(tiny_bundle), "Hello.", "--cfg-scale", "1e9"])
    assert stopped.value.code == 2
    assert "argument --cfg-scale: must be a number from 0 to 20, got '1e9'" in capsys.readouterr().err


def test_a_dialogue_option_on_plain_text_reads_the_same_from_every_front_end(tiny_bundle, tmp_path, capsys):
    said = "{} applies to a dialogue only: a script spoken with {}"
    assert cli_error(capsys, tmp_path, tiny_bundle, "Hello.", "--turn-gap", "0.5") == \
        said.format("--turn-gap", "--speaker N=VOICE")
    assert item_error(tiny_bundle, tmp_path, {"text": "Hello.", "turn_gap": 0.5}) == \
        said.format('"turn_gap"', '"speakers": {"N": VOICE}')


CONTROLS = "\u0000\u0001\u0002\r\x7f\x85"  # control characters, none a newline or a tab
NOTHING = "{} has nothing to speak (it is empty, or only whitespace and control characters)"


def test_nothing_speakable_is_refused_alike_by_every_front_end(tiny_bundle, tiny_15b_bundle, tmp_path, capsys):
    """Text of control characters alone was spoken (exit 0, a 200) while whitespace alone was refused: now both are
    nothing to speak, in one sentence, from the command line, HTTP, the speech socket, a batch item and the API."""
    import vibevoice_onnx
    from vibevoice_onnx.errors import VibeVoiceError

    for text in (CONTROLS, " \t\n" + CONTROLS + " "):
        assert cli_error(capsys, tmp_path, tiny_bundle, text) == NOTHING.format("the text")
        assert http_error(tiny_bundle, {"input": text}, "input") == NOTHING.format("input")
        assert item_error(tiny_bundle, tmp_path, {"text": text}) == NOTHING.format('"text"')
        assert http_error(tiny_15b_bundle, {"input": text, "voice": "alice"}, "input") == NOTHING.format("input")
        assert item_error(tiny_15b_bundle, tmp_path, {"script": text, "voice": "alice"}) == NOTHING.format('"text"')
        with pytest.raises(VibeVoiceError, match=NOTHING.format("the text").replace("(", r"\(").replace(")", r"\)")):
            vibevoice_onnx.open(str(tiny_bundle)).create(text, voice="synthetic", max_frames=2)
        with pytest.raises(VibeVoiceError, match="the script has nothing to speak"):
            vibevoice_onnx.open(str(tiny_15b_bundle)).create(text, "alice", max_frames=2)
    with TestClient(create_app(Models.open([tiny_bundle]), Settings())) as client:
        with client.websocket_connect("/v1/audio/speech/stream") as socket:
            socket.send_json({"model": "tts-1", "max_frames": 2})
            socket.send_json({"type": "input_text.delta", "delta": CONTROLS})
            socket.send_json({"type": "input_text.done"})
            event = socket.receive_json()
    assert event["type"] == "error" and event["error"]["message"] == NOTHING.format("the text"), event
    import subprocess
    import sys

    streamed = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "speak", str(tiny_bundle), "--stream-input",
                               "--max-frames", "2", "-o", str(tmp_path / "x.wav")], input=CONTROLS,
                              capture_output=True, text=True, timeout=120)
    assert streamed.returncode == EXIT_ERROR and streamed.stderr.count("error:") == 1, streamed.stderr
    assert streamed.stderr.endswith(f"error: {NOTHING.format('the text')}\n") and not (tmp_path / "x.wav").exists()


def test_control_characters_inside_a_text_are_removed_before_it_is_spoken(tiny_bundle, tmp_path, capsys):
    """"Hel\\x00lo" is spoken as "Hello" by every front-end: the same audio, sample for sample."""
    import numpy as np
    import soundfile as sf

    import vibevoice_onnx
    from vibevoice_onnx.audio import to_pcm16

    clean, dirty = "Hello there.\nBye.", "He\u0000llo\x1b there.\r\nBye.\u0007"
    tts = vibevoice_onnx.open(str(tiny_bundle))
    expected, _ = tts.create(clean, voice="synthetic", seed=3, max_frames=4)
    assert np.array_equal(tts.create(dirty, voice="synthetic", seed=3, max_frames=4)[0], expected)
    streamed = tts.text_stream("synthetic", seed=3, max_frames=4)
    for piece in (dirty[:3], dirty[3:9], dirty[9:]):
        streamed.feed(piece)
    streamed.finish()
    assert np.array_equal(np.concatenate([chunk.samples for chunk in streamed]), expected)
    assert main(["speak", str(tiny_bundle), dirty, "--seed", "3", "--max-frames", "4", "--wav-format", "float32",
                 "-o", str(tmp_path / "cli.wav")]) == 0
    assert np.array_equal(sf.read(str(tmp_path / "cli.wav"), dtype="float32")[0], expected)
    with TestClient(create_app(Models.open([tiny_bundle]), Settings())) as client:
        response = client.post("/v1/audio/speech", json={"model": "tts-1", "input": dirty, "seed": 3, "max_frames": 4,
                                                         "response_format": "pcm"})
    assert response.status_code == 200
    np.testing.assert_array_equal(np.frombuffer(response.content, "<i2"), to_pcm16(expected))


def test_an_items_voices_reach_the_model_as_given(tiny_15b_bundle, tmp_path, monkeypatch):
    """A voice file whose name looks like N=VOICE is a file, not Speaker 2's voice: an item's voice and speakers
    go to the model as they are, never through `--speaker` strings parsed back."""
    monkeypatch.chdir(tmp_path)
    write_voice_sample(tmp_path / "2=bob.wav", seconds=1.0)
    job = worker(tiny_15b_bundle, tmp_path)
    for item_id, voices in (("voice", {"voice": "2=bob.wav"}), ("speakers", {"speakers": {"1": "2=bob.wav"}})):
        row = job.run({"id": item_id, "script": "Speaker 1: Hello there.", "max_frames": 2, **voices})
        assert row.status == "ok", row.error
        assert row.output.endswith(f"{item_id}.wav")


def test_an_items_speakers_must_be_numbered(tiny_15b_bundle, tmp_path):
    error = item_error(tiny_15b_bundle, tmp_path, {"script": THREE, "speakers": {"Alice": "alice"}})
    assert error == '"speakers" maps each speaker number to a voice: {"1": "alice", "2": "bob"}'


def test_a_transcription_option_out_of_range_reads_the_same_from_the_server_and_an_item(tiny_asr_bundle, tmp_path):
    from vibevoice_onnx.cluster.workers import TranscriptionWorker

    audio = write_voice_sample(tmp_path / "talk.wav", seconds=1.0)
    said = "{} must be a whole number from 1 to 131072, got 0.5"
    with TestClient(create_app(Models.open([tiny_asr_bundle]), Settings())) as client:
        response = client.post("/v1/audio/transcriptions", data={"model": "whisper-1", "max_new_tokens": "0.5"},
                               files={"file": ("talk.wav", audio.read_bytes(), "audio/wav")})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_new_tokens"
    assert response.json()["error"]["message"] == said.format("max_new_tokens")
    job = TranscriptionWorker(str(tiny_asr_bundle), str(tmp_path / "job"))
    job.folder.prepare()
    row = job.run({"id": "talk", "audio": str(audio), "max_new_tokens": 0.5})
    assert row.status == "error" and row.error == said.format('"max_new_tokens"')


def test_open_gives_each_bundle_its_runtime_object_and_the_package_import_stays_light(tiny_bundle, tiny_15b_bundle,
                                                                                      tiny_asr_bundle):
    import subprocess
    import sys

    import vibevoice_onnx
    from vibevoice_onnx.runtime.asr import Transcriber
    from vibevoice_onnx.runtime.realtime import RealtimeTTS
    from vibevoice_onnx.runtime.tts15b import LongFormTTS

    for bundle, kind in ((tiny_bundle, RealtimeTTS), (tiny_15b_bundle, LongFormTTS), (tiny_asr_bundle, Transcriber)):
        assert type(vibevoice_onnx.open(str(bundle))) is kind
    light = "import sys, vibevoice_onnx; print(sorted(m for m in ('onnxruntime', 'numpy', 'torch') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, check=True).stdout == "[]\n"


@pytest.mark.parametrize("item, sentence", [
    ({"text": "Hello.", "voice": 5}, '"voice" must name a voice, got 5'),
    ({"text": "Hello.", "voice_latents": "median"}, '"voice_latents" must be sample or mean, got \'median\''),
    ({"text": "Hello.", "wav_format": "mp3"}, '"wav_format" must be one of pcm16, float32, got \'mp3\''),
    ({"text": "Hello.", "seed": "seven"}, '"seed" must be a whole number from 0 to 9223372036854775807, got \'seven\''),
])
def test_an_items_values_of_the_wrong_kind_get_a_sentence_naming_the_field(tiny_bundle, tmp_path, item, sentence):
    assert item_error(tiny_bundle, tmp_path, item) == sentence


@pytest.mark.parametrize("name", ["{", "{0}", "}{1!r:>{2}}", "}{field}{{"])
def test_a_voice_name_with_braces_never_breaks_the_sentence(tiny_bundle, tmp_path, capsys, name):
    """Sentences quote what the client sent, so a name that looks like a format string must not be read as one
    (a "{" was a ValueError while the error was worded: a traceback instead of a 400). Names with no `{word}` in
    them read back exactly."""
    said = http_error(tiny_bundle, {"input": "Hello.", "voice": name}, "voice")
    assert said.startswith(f"voice: the model has no voice '{name}'" if "{field}" not in name else "voice: the model")
    assert item_error(tiny_bundle, tmp_path, {"text": "Hello.", "voice": name}).startswith('"voice": the model has no')
    assert cli_error(capsys, tmp_path, tiny_bundle, "Hello.", "--voice", name).startswith("--voice: the model has no")


def _limit_sentence(name: str, value) -> str:
    from vibevoice_onnx.options import LIMITS

    return f"{name} must be {LIMITS[name].describe()}, got {value!r}"


SPEAKERS_SHAPE = 'speakers maps each speaker\'s number to a voice: {"1": "alice", "2": "bob"}'


@pytest.mark.parametrize("make, field, code, sentence", [
    (lambda r: r.SpeechRequest("x" * 11, max_chars=10), "text", "invalid_value",
     "text is 11 characters long, over the limit of 10"),
    (lambda r: r.SpeechRequest(" \x00\x85 \u0090 "), "text", "empty_input", NOTHING.format("text")),
    (lambda r: r.SpeechRequest("Hi", voice="  "), "voice", "invalid_value", "voice must name a voice, got '  '"),
    (lambda r: r.SpeechRequest("Hi", voice=7), "voice", "invalid_value", "voice must name a voice, got 7"),
    (lambda r: r.SpeechRequest("Hi", voice_latents="both"), "voice_latents", "invalid_value",
     "voice_latents must be sample or mean, got 'both'"),
    (lambda r: r.SpeechRequest("Hi", speakers={True: "alice"}), "speakers", "invalid_value", SPEAKERS_SHAPE),
    (lambda r: r.SpeechRequest("Hi", speakers={"1": "alice"}), "speakers", "invalid_value", SPEAKERS_SHAPE),
    (lambda r: r.SpeechRequest("Hi", speakers={1: " "}), "speakers", "invalid_value", SPEAKERS_SHAPE),
    (lambda r: r.SpeechRequest("Hi", speakers={None: 3}), "speakers", "invalid_value", SPEAKERS_SHAPE),
    (lambda r: r.SpeechRequest("Hi", cfg_scale=99.0), "cfg_scale", "invalid_value", _limit_sentence("cfg_scale", 99.0)),
    (lambda r: r.TranscriptionRequest(hotwords=3), "hotwords", "invalid_value", "hotwords must be text, got int"),
    (lambda r: r.TranscriptionRequest(mean_latents="yes"), "mean_latents", "invalid_value",
     "mean_latents must be true or false, got 'yes'"),
    (lambda r: r.TranscriptionRequest(repetition_guard=1), "repetition_guard", "invalid_value",
     "repetition_guard must be true or false, got 1"),
    (lambda r: r.TranscriptionRequest(seed=-1), "seed", "invalid_value", _limit_sentence("seed", -1)),
    (lambda r: r.TranscriptionRequest(max_new_tokens=0), "max_new_tokens", "invalid_value",
     _limit_sentence("max_new_tokens", 0)),
], ids=["text over max_chars", "nothing speakable", "blank voice", "voice not text", "voice_latents",
        "speaker true", "speaker number as text", "speaker blank voice", "lone speaker voice not text", "cfg_scale",
        "hotwords not text", "mean_latents not bool", "repetition_guard not bool", "seed", "max_new_tokens"])
def test_each_refused_field_names_itself_with_its_code_and_sentence(make, field, code, sentence):
    """The request layer itself, as every front-end meets it: the field named, the code an HTTP client reads
    (empty_input for nothing to speak), and the sentence, before any model is looked at."""
    from vibevoice_onnx import requests
    from vibevoice_onnx.requests import RequestError

    with pytest.raises(RequestError) as refused:
        made = make(requests)
        made.options() if isinstance(made, requests.TranscriptionRequest) else made.check()
    assert (refused.value.field, refused.value.code, str(refused.value)) == (field, code, sentence)


def test_a_request_within_its_limits_is_kept_as_given_and_cleaned_of_control_characters():
    from vibevoice_onnx.requests import SpeechRequest, TranscriptionRequest

    speech = SpeechRequest("Hi\x00 there\u0090.", voice="alice", speakers={None: "bob", 2: "carol"}, max_chars=16,
                           cfg_scale=1.5, seed=3)
    speech.check()
    assert (speech.text, speech.voice, speech.speakers, speech.cfg_scale, speech.seed) == \
        ("Hi there.", "alice", {None: "bob", 2: "carol"}, 1.5, 3)
    SpeechRequest("x" * 10, max_chars=10).check()  # at the limit: kept, no error
    for voice_latents in ("sample", "mean"):
        SpeechRequest("Hi", voice_latents=voice_latents).check()
    streamed = SpeechRequest("", text_stream=True)
    streamed.check()  # a streamed text may start empty
    assert streamed.text == ""
    options = TranscriptionRequest(hotwords="Ray, ONNX", seed=4, max_new_tokens=9, mean_latents=True).options()
    assert options == {"hotwords": "Ray, ONNX", "seed": 4, "mean_latents": True, "repetition_guard": True,
                       "max_new_tokens": 9}
    assert "max_new_tokens" not in TranscriptionRequest().options()  # the runtime's own cap


# start_speech: a request, checked against the open model, begins the runtime's own call with the options it gives.

DIALOGUE = "Speaker 1: Hello there.\nSpeaker 2: Bye now."


@pytest.fixture(scope="module")
def realtime(tiny_bundle):
    import vibevoice_onnx

    return vibevoice_onnx.open(str(tiny_bundle))


@pytest.fixture(scope="module")
def long_form(tiny_15b_bundle):
    import vibevoice_onnx

    return vibevoice_onnx.open(str(tiny_15b_bundle))


def heard(speech) -> tuple[list[int], object]:
    """What a Speech gives: its chunks' lengths (how it was decoded) and its samples."""
    import numpy as np

    chunks = [chunk.samples for chunk in speech]
    return [len(chunk) for chunk in chunks], np.concatenate(chunks)


def same_speech(got, expected) -> bool:
    import numpy as np

    (got_chunks, got_samples), (expected_chunks, expected_samples) = heard(got), heard(expected)
    return got_chunks == expected_chunks and np.array_equal(got_samples, expected_samples)


def noise_file(tmp_path, frames: int, latent: int):
    import numpy as np

    np.save(tmp_path / "noise.npy", np.random.default_rng(11).standard_normal((frames, latent)).astype(np.float32))
    return tmp_path / "noise.npy"


def test_a_realtime_request_speaks_what_the_runtime_speaks_with_the_options_it_gives(realtime, tmp_path):
    """Plain text: cfg_scale, steps, seed, max_frames, decode_group and a front-end's own runtime options reach
    `stream` as given (each of them changes what is heard, so one that is lost shows); no voice: the model's first."""
    from vibevoice_onnx.requests import SpeechRequest, start_speech

    options = dict(cfg_scale=2.5, steps=3, seed=3, max_frames=4)
    started = start_speech(realtime, SpeechRequest("Hello there.", decode_group=2, **options))
    assert started.described == "voice synthetic" and started.preparing is None
    assert same_speech(started.speech, realtime.stream("Hello there.", "synthetic", decode_group=2, **options))
    by_extra = start_speech(realtime, SpeechRequest("Hello there.", extra={"decode_group": 2}, **options))
    assert same_speech(by_extra.speech, realtime.stream("Hello there.", "synthetic", decode_group=2, **options))
    for left_out in ("cfg_scale", "steps"):  # the kind's defaults, which differ from the options above
        fewer = {k: v for k, v in options.items() if k != left_out}
        assert not same_speech(start_speech(realtime, SpeechRequest("Hello there.", **fewer)).speech,
                               realtime.stream("Hello there.", "synthetic", **options))
    assert not same_speech(start_speech(realtime, SpeechRequest("Hello there.", **options)).speech,
                           realtime.stream("Hello there.", "synthetic", decode_group=2, **options))


def test_a_realtime_request_with_noise_rows_speaks_them(realtime, tmp_path):
    from vibevoice_onnx.requests import SpeechRequest, start_speech
    from vibevoice_onnx.sampling import NoiseSource

    rows = noise_file(tmp_path, 4, realtime.latent_size)
    started = start_speech(realtime, SpeechRequest("Hello there.", noise=rows, max_frames=4))
    assert same_speech(started.speech, realtime.stream("Hello there.", "synthetic", max_frames=4,
                                                       noise=NoiseSource.from_file(rows, realtime.latent_size)))


def test_a_streamed_text_request_speaks_what_the_runtime_speaks_and_keeps_its_limit(realtime, tmp_path):
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.requests import SpeechRequest, start_speech
    from vibevoice_onnx.sampling import NoiseSource

    rows = noise_file(tmp_path, 4, realtime.latent_size)
    started = start_speech(realtime, SpeechRequest("", text_stream=True, noise=rows, max_frames=4, max_chars=40))
    direct = realtime.text_stream("synthetic", noise=NoiseSource.from_file(rows, realtime.latent_size), max_frames=4)
    for stream in (started.speech, direct):
        stream.feed("Hello there, ")
        stream.feed("and bye.")
        stream.finish()
    assert started.described == "voice synthetic, text from standard input as it arrives"
    assert same_speech(started.speech, direct)
    limited = start_speech(realtime, SpeechRequest("", text_stream=True, max_frames=4, max_chars=5)).speech
    with pytest.raises(VibeVoiceError, match="the text is longer than the limit of 5 characters"):
        limited.feed("Hello there.")
    limited.close()


@pytest.mark.parametrize("turn_gap", [None, 0.25])
def test_a_dialogue_request_speaks_what_the_runtime_speaks(realtime, turn_gap):
    """A script with a voice per speaker: `dialogue`, the turn gap as given (none: no gap)."""
    from vibevoice_onnx.requests import SpeechRequest, start_speech

    speakers, options = {1: "synthetic", 2: "synthetic"}, dict(cfg_scale=2.5, steps=3, seed=3, max_frames=3)
    started = start_speech(realtime, SpeechRequest(DIALOGUE, speakers=speakers, turn_gap=turn_gap, **options))
    assert started.described == "dialogue, one turn per line, speakers 1=synthetic, 2=synthetic (turn k: seed + k)"
    assert same_speech(started.speech, realtime.dialogue(DIALOGUE, speakers, turn_gap=turn_gap or 0.0, **options))
    lone = start_speech(realtime, SpeechRequest("Speaker 1: Hello.", speakers={None: "synthetic"}, seed=3,
                                                max_frames=2))
    assert lone.described == "dialogue, one turn per line, speakers synthetic (turn k: seed + k)"


@pytest.mark.parametrize("voice_latents, seeded, noisy", [("mean", True, False), ("mean", False, True),
                                                          (None, True, True)])
def test_a_long_form_request_speaks_what_the_runtime_speaks(long_form, tmp_path, voice_latents, seeded, noisy):
    """A script and its speakers' voices: `stream`, with the voice latents asked for (none: sampled, as upstream),
    the noise rows or seed given, and the work before the first audio said in words."""
    from vibevoice_onnx.requests import SpeechRequest, start_speech
    from vibevoice_onnx.sampling import NoiseSource

    text, options = "Speaker 1: Hello there.", dict(cfg_scale=2.5, steps=3, max_frames=3, seed=3 if seeded else None)
    rows = noise_file(tmp_path, 3, long_form.latent_size) if noisy else None
    started = start_speech(long_form, SpeechRequest(text, speakers={1: "alice"}, voice_latents=voice_latents,
                                                    noise=rows, **options))
    direct = long_form.stream(text, {1: "alice"}, voice_latents=voice_latents or "sample",
                              noise=NoiseSource.from_file(rows, long_form.latent_size) if noisy else None, **options)
    assert started.described == f"speakers 1=alice, voice latents {voice_latents or 'sample'}"
    assert same_speech(started.speech, direct)
    voice = started.speech.voices[0]
    assert started.preparing == (f"encoding 1 voice sample ({voice.seconds:.1f} s of audio) and a "
                                 f"{started.speech.prompt_tokens}-token prompt before the first audio")


def test_a_long_form_request_with_two_voices_says_it_encodes_both(long_form):
    from vibevoice_onnx.requests import SpeechRequest, start_speech

    started = start_speech(long_form, SpeechRequest("Speaker 1: Hello.\nSpeaker 2: Bye.", speakers={1: "alice", 2: "alice"},
                                                    seed=3, max_frames=2))
    seconds = sum(voice.seconds for voice in started.speech.voices)
    assert started.preparing == (f"encoding 2 voice samples ({seconds:.1f} s of audio) and a "
                                 f"{started.speech.prompt_tokens}-token prompt before the first audio")


NO_DIALOGUE = "{field} does not apply to a dialogue (speakers): each turn uses its speaker's voice and the noise of seed + turn"


@pytest.mark.parametrize("model, fields, field, sentence, speaker", [
    ("realtime", dict(voice_latents="mean"), "voice_latents",
     "voice_latents does not apply to a realtime bundle (its voices are cached prompts, not audio samples)", "N"),
    ("realtime", dict(text=DIALOGUE, speakers={1: "synthetic", 2: "synthetic"}, voice="synthetic"), "voice",
     NO_DIALOGUE.format(field="voice"), "N"),
    ("realtime", dict(text=DIALOGUE, speakers={1: "synthetic", 2: "synthetic"}, noise="rows"), "noise",
     NO_DIALOGUE.format(field="noise"), "N"),
    ("realtime", dict(text=DIALOGUE, speakers={1: "synthetic", 2: "synthetic"}, text_stream=True), "text_stream",
     NO_DIALOGUE.format(field="text_stream"), "N"),
    ("realtime", dict(turn_gap=0.5), "turn_gap", "turn_gap applies to a dialogue only: a script spoken with "
     "speakers N=VOICE", "N"),
    ("realtime", dict(seed=3, noise="rows"), "seed", "give either seed or noise, not both", "N"),
    ("realtime", dict(noise="rows", max_frames=5), "noise", "{rows}: has 4 rows, fewer than max_frames 5", "N"),
    ("realtime", dict(text="Speaker 1: Hi.", speakers={None: "synthetic", 1: "synthetic"}), "speakers",
     "the script has speakers 1: give each its voice as speakers N=VOICE", "N"),
    ("realtime", dict(text=DIALOGUE, speakers={None: "synthetic"}), "speakers",
     "the script has speakers 1, 2: give each its voice as speakers N=VOICE", "N"),
    ("realtime", dict(text=DIALOGUE, speakers={1: "synthetic", 2: "synthetic", 7: "synthetic", 5: "synthetic"}),
     "speakers", "a voice is given for Speaker 5, who does not speak in the script (speakers: 1, 2)", 5),
    ("realtime", dict(text=DIALOGUE, speakers={1: "synthetic"}), "speakers",
     "Speaker 2 speaks in the script but has no voice: add speakers 2=VOICE", 2),
    ("realtime", dict(text=DIALOGUE, speakers={1: "synthetic", 2: "nobody"}), "speakers",
     "speakers: the model has no voice 'nobody' (available: synthetic), and it is no voice file or http(s) URL", "N"),
    ("1.5b", dict(speakers={1: "alice"}, voice="alice"), "voice",
     "voice does not apply to a 1.5b bundle; give each speaker a voice with speakers N=VOICE", "N"),
    ("1.5b", dict(speakers={1: "alice"}, decode_group=2), "decode_group", "decode_group does not apply to a 1.5b "
     "bundle (each latent's audio feeds the next step, so it is decoded at once)", "N"),
    ("1.5b", dict(speakers={1: "alice"}, text_stream=True), "text_stream",
     "text_stream does not apply to a 1.5b bundle", "N"),
    ("1.5b", dict(speakers={1: "alice"}, turn_gap=0.5), "turn_gap", "turn_gap does not apply to a 1.5b bundle", "N"),
    ("1.5b", dict(speakers={1: "alice"}, seed=3, noise="rows", voice_latents="mean"), "seed",
     "give either seed or noise with voice_latents mean: nothing else is random", "N"),
    ("1.5b", dict(), "speakers",
     "give each speaker of the script a voice: speakers N=VOICE (a bundle voice or an audio file)", "N"),
], ids=["voice_latents realtime", "voice in a dialogue", "noise in a dialogue", "text_stream in a dialogue",
        "turn_gap on plain text", "seed and noise", "noise too short", "lone and numbered", "lone for two",
        "unused speaker", "speaker without voice", "unknown speaker voice", "voice long-form",
        "decode_group long-form", "text_stream long-form", "turn_gap long-form", "seed noise mean", "no speakers"])
def test_each_request_the_model_cannot_take_is_refused_naming_its_field(realtime, long_form, tmp_path, model, fields,
                                                                       field, sentence, speaker):
    """Checked against the open model, before any audio: the field, the sentence, the speaker it names."""
    from vibevoice_onnx.requests import RequestError, SpeechRequest, start_speech

    rows = noise_file(tmp_path, 4, realtime.latent_size)
    fields = {"text": "Speaker 1: Hello." if model == "1.5b" else "Hello.", **fields}
    if fields.get("noise") == "rows":
        fields["noise"] = rows
    with pytest.raises(RequestError) as refused:
        start_speech({"realtime": realtime, "1.5b": long_form}[model], SpeechRequest(**fields))
    assert (refused.value.field, str(refused.value), refused.value.speaker) == \
        (field, sentence.format(rows=rows), speaker)


def test_a_realtime_bundle_without_voices_says_how_to_import_one(tiny_bundle, tmp_path):
    import shutil

    import vibevoice_onnx
    from vibevoice_onnx.requests import RequestError, SpeechRequest, start_speech

    bare = copy_bundle(tiny_bundle, tmp_path / "bare")
    shutil.rmtree(bare / "voices")
    with pytest.raises(RequestError) as refused:
        start_speech(vibevoice_onnx.open(str(bare)), SpeechRequest("Hello."))
    assert (refused.value.field, str(refused.value)) == \
        ("voice", "the model has no voices; import one with `vibevoice-onnx voices import`")


def test_a_voice_is_one_of_the_model_or_where_files_are_allowed_a_file_or_url(realtime, tmp_path):
    from vibevoice_onnx.requests import RequestError, check_voice

    (tmp_path / "mine.pt").write_bytes(b"")
    for voice in ("synthetic", "https://example.com/mine.pt", "http://example.com/mine.pt", str(tmp_path / "mine.pt")):
        check_voice(realtime, "voice", voice, files=True)
    for voice in ("https://example.com/mine.pt", str(tmp_path / "mine.pt")):
        with pytest.raises(RequestError) as refused:
            check_voice(realtime, "voice", voice, files=False)
        assert (refused.value.code, str(refused.value)) == \
            ("voice_not_found", f"voice: the model has no voice '{voice}' (available: synthetic)")


def test_each_field_of_a_sentence_reads_in_the_front_ends_spelling():
    from vibevoice_onnx.requests import RequestError, Spelling

    error = RequestError("seed", "give either {seed} or {noise} for {field}, as {entry}", speaker=2)
    flag = Spelling(name=lambda name: "--" + name.replace("_", "-"), entry="--speaker {n}=VOICE")
    assert error.spelled(flag) == "give either --seed or --noise for --seed, as --speaker 2=VOICE"


def test_a_long_form_kind_speaks_every_text_as_a_script_and_realtime_only_a_labelled_one():
    from vibevoice_onnx.requests import is_script

    assert is_script("1.5b", "Just words.") and is_script("realtime", "Speaker 1: Hi.")
    assert not is_script("realtime", "Just words.")


def test_a_transcription_request_runs_the_transcriber_with_its_options_and_hooks(tiny_asr_bundle, tmp_path):
    import vibevoice_onnx
    from vibevoice_onnx.requests import TranscriptionRequest, transcribe

    write_voice_sample(tmp_path / "speech.flac")
    transcriber = vibevoice_onnx.open(str(tiny_asr_bundle))
    seen = []
    got = transcribe(transcriber, tmp_path / "speech.flac", TranscriptionRequest(seed=1, max_new_tokens=4),
                     progress=lambda tokens, seconds: seen.append(tokens))
    expected = transcriber.transcribe(tmp_path / "speech.flac", seed=1, max_new_tokens=4)
    assert (got.tokens, got.text) == (expected.tokens, expected.text) and len(got.tokens) == 4
    assert seen == [1, 2, 3, 4]  # the hook, called after each token
