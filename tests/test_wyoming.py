"""`vibevoice-onnx wyoming` (Home Assistant's protocol), driven by the `wyoming` package's own client, which no one
here wrote, against a server this module starts on 127.0.0.1 over tiny realtime, 1.5B, ASR and ASR-Streaming
bundles: what it offers, speech against `speak --seed`, transcripts against `transcribe --seed`, and bad input."""

from __future__ import annotations

import asyncio
import json
import signal

import numpy as np
import pytest

pytest.importorskip("wyoming")
pytest.importorskip("fastapi")

from wyoming.asr import Transcribe, Transcript, TranscriptChunk  # noqa: E402
from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop,  # noqa: E402
                         SynthesizeStopped, SynthesizeVoice)

from helpers import WyomingServer, cli  # noqa: E402

TEXT = "Hello from a voice assistant, spoken as it streams."
SCRIPT = "Speaker 1: Good morning.\nSpeaker 2: And a good morning to you."
SEED, FRAMES, TOKENS = 7, 60, 6
BODY_TIMEOUT = 3  # seconds a stream may stay silent
UPLOAD_MB = 0.5
WAIT = 60  # seconds for any one answer


@pytest.fixture(scope="module")
def server(tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tiny_streaming_bundle, tmp_path_factory):
    log = tmp_path_factory.mktemp("wyoming") / "server.log"
    running = WyomingServer([tiny_bundle, tiny_15b_bundle, tiny_asr_bundle, tiny_streaming_bundle], log, "--seed",
                            str(SEED), "--max-frames", str(FRAMES), "--max-new-tokens", str(TOKENS),
                            "--body-timeout", str(BODY_TIMEOUT), "--max-upload-mb", str(UPLOAD_MB),
                            "--max-active", "2", "--max-queue", "8")
    yield running
    assert running.stop() == 0, log.read_text()


async def exchange(port: int, events: list, until: str = "error", raw: bytes = b"", errors_end: bool = True
                   ) -> list[Event]:
    """Send `raw` bytes and `events`, then read every answer up to one of type `until` (or an error, where
    `errors_end`), or to the end of the connection (each read bounded)."""
    answers = []
    async with AsyncTcpClient("127.0.0.1", port) as client:
        if raw:
            client._writer.write(raw)  # bytes no client library would send
        for event in events:
            await client.write_event(event if isinstance(event, Event) else event.event())
        while (event := await asyncio.wait_for(client.read_event(), WAIT)) is not None:
            answers.append(event)
            if event.type == until or errors_end and event.type == "error":
                break
    return answers


def talk(server, events: list, until: str = "error", raw: bytes = b"", errors_end: bool = True) -> list[Event]:
    return asyncio.run(exchange(server.port, events, until, raw, errors_end))


def audio_of(answers: list[Event]) -> np.ndarray:
    """The samples of exactly one audio-start ... audio-stop, 24 kHz 16-bit mono."""
    kinds = [e.type for e in answers if e.type.startswith("audio-")]
    assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop" and kinds.count("audio-start") == 1, kinds
    start = AudioStart.from_event(next(e for e in answers if AudioStart.is_type(e.type)))
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    return np.frombuffer(b"".join(AudioChunk.from_event(e).audio for e in answers if AudioChunk.is_type(e.type)), "<i2")


def chunk_count(answers: list[Event]) -> int:
    return sum(AudioChunk.is_type(e.type) for e in answers)


def spoken(bundle, text: str = TEXT, *voices: str) -> np.ndarray:
    """`speak --raw` for the same seed and frame limit: int16 samples."""
    voice = [a for n, v in enumerate(voices, 1) for a in ("--speaker", f"{n}={v}")] or ["--voice", "synthetic"]
    return np.frombuffer(cli("speak", str(bundle), text, *voice, "--seed", str(SEED), "--max-frames", str(FRAMES),
                             "--raw"), "<i2")


# ---- what it offers ----

def test_describe_lists_a_program_per_model_with_voices_languages_and_streaming(server):
    info = Info.from_event(talk(server, [Describe()], "info")[-1])
    tts = {p.name: p for p in info.tts}
    assert set(tts) == {"vibevoice-realtime-cpu-fp32", "vibevoice-1.5b-cpu-fp32"}
    realtime, long_form = tts["vibevoice-realtime-cpu-fp32"], tts["vibevoice-1.5b-cpu-fp32"]
    assert realtime.supports_synthesize_streaming and not long_form.supports_synthesize_streaming
    assert [(v.name, v.languages) for v in realtime.voices] == [("synthetic", ["en"])]
    assert [(v.name, v.languages) for v in long_form.voices] == [("alice", ["en", "zh"])]
    asr = {p.name: p for p in info.asr}
    assert set(asr) == {"vibevoice-asr-cpu-fp32", "vibevoice-asr-streaming-cpu-fp32"}
    assert asr["vibevoice-asr-streaming-cpu-fp32"].supports_transcript_streaming
    assert not asr["vibevoice-asr-cpu-fp32"].supports_transcript_streaming
    assert len(asr["vibevoice-asr-streaming-cpu-fp32"].models[0].languages) == 10
    assert all(p.version and p.attribution.url == "https://github.com/microsoft/VibeVoice" for p in info.tts + info.asr)


# ---- speech ----

def test_synthesize_gives_speaks_samples_in_chunks_as_frames_decode(server, tiny_bundle):
    answers = talk(server, [Synthesize(TEXT, voice=SynthesizeVoice(name="synthetic"))], "audio-stop")
    assert np.array_equal(audio_of(answers), spoken(tiny_bundle))
    assert chunk_count(answers) > 1  # not one chunk of the whole


def test_streamed_text_gives_the_whole_texts_audio_and_ignores_the_compatibility_copy(server, tiny_bundle):
    pieces = [TEXT[i:i + 4] for i in range(0, len(TEXT), 4)]
    events = [SynthesizeStart(voice=SynthesizeVoice(name="synthetic")), *[SynthesizeChunk(p) for p in pieces],
              Synthesize(TEXT, voice=SynthesizeVoice(name="synthetic")), SynthesizeStop()]
    answers = talk(server, events, "synthesize-stopped")
    assert SynthesizeStopped.is_type(answers[-1].type)
    assert np.array_equal(audio_of(answers), spoken(tiny_bundle))


def test_a_script_speaks_with_a_voice_per_speaker_on_the_long_form_model(server, tiny_15b_bundle):
    answers = talk(server, [Synthesize(SCRIPT, voice=SynthesizeVoice(name="alice,alice"))], "audio-stop")
    assert np.array_equal(audio_of(answers), spoken(tiny_15b_bundle, SCRIPT, "alice", "alice"))


def test_a_voice_chosen_by_language_speaks_every_speaker_of_a_script(server, tiny_15b_bundle):
    answers = talk(server, [Synthesize(SCRIPT, voice=SynthesizeVoice(language="zh-CN"))], "audio-stop")
    assert np.array_equal(audio_of(answers), spoken(tiny_15b_bundle, SCRIPT, "alice", "alice"))


@pytest.mark.parametrize("events, sentence", [
    ([Synthesize(TEXT, voice=SynthesizeVoice(name="nobody"))],
     "voice 'nobody' is no voice of this server (voices: alice, synthetic)"),
    ([Synthesize(" \x07 ")], "input has nothing to speak"),
    ([SynthesizeStart(voice=SynthesizeVoice(name="alice"))], "speaks whole texts only"),
    ([SynthesizeChunk("stray")], "a synthesize-chunk came outside a streamed synthesis"),
    ([SynthesizeStop()], "a synthesize-stop came without synthesize-start"),
    ([Event("no-such-event")], "unknown event type 'no-such-event'"),
    ([Event("synthesize", {"voice": {"name": "synthetic"}})], "a synthesize event with a missing or malformed field"),
    ([AudioChunk(16000, 2, 1, b"\0\0")], "an audio-chunk came before audio-start"),
    ([AudioStop()], "an audio-stop came without audio-start"),
    ([AudioStart(16000, 3, 1)], "audio of 3-byte samples and 1 channel(s) is not taken"),
    ([AudioStart(1, 2, 1)], "audio-start's rate must be"),
    ([Transcribe(name="nothing-here"), AudioStart(16000, 2, 1)], "no transcription model 'nothing-here'"),
    ([AudioStart(16000, 2, 1), AudioChunk(16000, 2, 1, b"\0\0\0")], "3 bytes is not a multiple"),
    ([AudioStart(16000, 2, 1), AudioChunk(8000, 2, 1, b"\0\0")], "an audio-chunk of 8000 Hz"),
    ([AudioStart(16000, 2, 1), AudioStop()], "no audio came between audio-start and audio-stop"),
])
def test_a_wrong_request_is_one_error_event_and_the_connection_goes_on(server, events, sentence):
    answers = talk(server, [*events, Describe()], "info", errors_end=False)
    errors = [Error.from_event(e) for e in answers if Error.is_type(e.type)]
    assert len(errors) == 1 and sentence in errors[0].text, answers
    assert Info.is_type(answers[-1].type)  # the next event is answered on the same connection


# ---- transcription ----

def speech_like(seconds: float, rate: int, channels: int) -> np.ndarray:
    """int16 [samples, channels]: a voiced, modulated tone (random weights transcribe anything alike)."""
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * 200 * t) * np.sin(2 * np.pi * 2 * t)
    return (np.stack([wave * (1 - 0.2 * c) for c in range(channels)], 1) * 32767).astype("<i2")


def transcription_events(pcm: np.ndarray, rate: int, name: str | None = None, piece: int = 1024, width: int = 2
                         ) -> list:
    channels = pcm.shape[1]
    data = pcm.tobytes()
    step = piece * width * channels
    return [Transcribe(name=name, language="en"), AudioStart(rate, width, channels),
            *[AudioChunk(rate, width, channels, data[i:i + step]) for i in range(0, len(data), step)], AudioStop()]


def wav(path, pcm: np.ndarray, rate: int):
    import soundfile as sf

    sf.write(str(path), pcm, rate, subtype="PCM_16")
    return path


def test_a_transcript_equals_transcribes_text_whatever_rate_and_channels_come(server, tiny_asr_bundle, tmp_path):
    pcm = speech_like(1.5, 16000, 2)  # a satellite's 16 kHz, in stereo: resampled and mixed down
    answers = talk(server, transcription_events(pcm, 16000, "vibevoice-asr-cpu-fp32"), "transcript")
    expected = json.loads(cli("transcribe", str(tiny_asr_bundle), str(wav(tmp_path / "a.wav", pcm, 16000)),
                              "--format", "json", "--seed", str(SEED), "--max-new-tokens", str(TOKENS)))
    segments = [s["text"] for s in expected["segments"] if s["text"]]
    text = Transcript.from_event(answers[-1]).text
    assert text == (" ".join(segments) if segments else expected["text"].strip()) and text
    assert Transcript.from_event(answers[-1]).language == "en"


@pytest.mark.parametrize("width", [2, 4])
def test_each_chunk_is_mixed_down_from_every_channel_and_scaled_by_its_width(width):
    """A satellite's chunk as the model hears it: the mean of its channels (not one of them), full scale at ±1 for
    16- and 32-bit PCM alike (docs/home-assistant.md promises both)."""
    from vibevoice_onnx.serve.wyoming import Listening

    full = 2 ** (8 * width - 1)
    left = np.array([0.5, -0.25, 0.125, 0.0]) * full
    right = np.array([-0.25, 0.75, 0.125, -0.5]) * full
    pcm = np.stack([left, right], 1).astype(f"<i{width}")
    listening = Listening(model=None, asked=Transcribe(), hotwords=None, rate=16000, width=width, channels=2)
    samples = listening.samples(AudioChunk(16000, width, 2, pcm.tobytes()))
    assert samples.dtype == np.float32
    np.testing.assert_allclose(samples, [0.125, 0.25, 0.125, -0.25], rtol=0, atol=1e-6)


def test_32_bit_audio_transcribes_as_the_same_audio_in_16_bits(server):
    """The 32-bit path end to end (its scale is pinned above: the model normalises loudness, so a transcript
    cannot tell)."""
    pcm = speech_like(1.5, 16000, 1)
    wide = pcm.astype("<i4") << 16  # the same samples, 32-bit
    events = transcription_events(wide, 16000, "vibevoice-asr-cpu-fp32", width=4)
    assert AudioStart.from_event(events[1].event()).width == 4
    answers = talk(server, events, "transcript")
    same = talk(server, transcription_events(pcm, 16000, "vibevoice-asr-cpu-fp32"), "transcript")
    assert Transcript.from_event(answers[-1]).text == Transcript.from_event(same[-1]).text


def test_streaming_transcription_sends_transcribe_streams_chunks(server, tiny_streaming_bundle, tmp_path):
    pcm = speech_like(7.0, 24000, 1)  # chunks of 2.93 s: three
    answers = talk(server, transcription_events(pcm, 24000, "vibevoice-asr-streaming-cpu-fp32"), "transcript-stop")
    kinds = [e.type for e in answers]
    assert kinds[0] == "transcript-start" and kinds[-2:] == ["transcript", "transcript-stop"], kinds
    chunks = [TranscriptChunk.from_event(e).text for e in answers if TranscriptChunk.is_type(e.type)]
    lines = cli("transcribe", str(tiny_streaming_bundle), str(wav(tmp_path / "s.wav", pcm, 24000)), "--stream",
                "--format", "json", "--seed", str(SEED), "--max-tokens-per-chunk", str(TOKENS))
    expected = [json.loads(line)["text"] for line in lines.decode().splitlines()]
    assert chunks == expected and len(chunks) > 1
    assert Transcript.from_event(answers[-2]).text == "".join(expected)


def test_silence_is_an_empty_transcript(server):
    answers = talk(server, transcription_events(np.zeros((16000, 1), "<i2"), 16000, "vibevoice-asr-cpu-fp32"),
                   "transcript")
    assert Transcript.from_event(answers[-1]).text == ""


# ---- hostile clients and load ----

def test_audio_past_the_upload_limit_is_dropped_with_an_error(server):
    second = speech_like(1.0, 16000, 1).tobytes()
    chunks = [AudioChunk(16000, 2, 1, second) for _ in range(int(UPLOAD_MB * 2**20 / len(second)) + 2)]
    answers = talk(server, [AudioStart(16000, 2, 1), *chunks, AudioStop(), Describe()], "info", errors_end=False)
    errors = [Error.from_event(e).text for e in answers if Error.is_type(e.type)]
    assert errors[0] == ("the audio is over the limit of 0.5 MB (--max-upload-mb); the audio is dropped: start "
                         "again with audio-start"), errors
    assert Info.is_type(answers[-1].type)


@pytest.mark.parametrize("raw, sentence", [
    (b"this is no json\n", "is not valid JSON"),
    (b'{"no": "type"}\n', "needs a string \"type\""),
    (b'{"type": "audio-chunk", "payload_length": 99999999999}\n', "\"payload_length\" must be a whole number of bytes"),
    (b'{"type": "describe", "data_length": -1}\n', "\"data_length\" must be a whole number of bytes"),
    (b"[" * 70000, "longer than 64 KiB"),
])
def test_bytes_that_are_no_event_close_the_connection_with_an_error(server, raw, sentence):
    answers = talk(server, [], raw=raw)
    assert [e.type for e in answers] == ["error"] and sentence in Error.from_event(answers[0]).text


def test_a_stream_left_silent_is_closed_after_the_body_timeout(server):
    answers = talk(server, [AudioStart(16000, 2, 1)])
    assert "nothing came for 3 s while a stream was open" in Error.from_event(answers[-1]).text


def test_a_streamed_synthesis_left_silent_is_closed_after_the_body_timeout(server):
    """Text streamed in, then nothing (no synthesize-stop): the client gets the audio of what came, then the same
    error as a silent listener, and the connection ends instead of holding a generation slot for ever."""
    answers = talk(server, [SynthesizeStart(voice=SynthesizeVoice(name="synthetic")),
                            SynthesizeChunk("Text that starts, and then nothing more comes ")])
    assert "nothing came for 3 s while a stream was open" in Error.from_event(answers[-1]).text


def test_clients_that_leave_mid_stream_free_their_slots_for_the_next(server, tiny_bundle):
    async def leave_mid_audio():
        client = AsyncTcpClient("127.0.0.1", server.port)
        await client.connect()
        await client.write_event(Synthesize(TEXT).event())
        assert AudioStart.is_type((await asyncio.wait_for(client.read_event(), WAIT)).type)
        await client.disconnect()

    async def leave_mid_stream():
        async with AsyncTcpClient("127.0.0.1", server.port) as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk("Half a sentence and then").event())

    for _ in range(3):  # more than --max-active 2: slots still held would make the last ones wait or fail
        asyncio.run(leave_mid_audio())
        asyncio.run(leave_mid_stream())
    answers = talk(server, [Synthesize(TEXT, voice=SynthesizeVoice(name="synthetic"))], "audio-stop")
    assert np.array_equal(audio_of(answers), spoken(tiny_bundle))


def test_many_clients_at_once_each_get_their_own_audio(server, tiny_bundle):
    async def all_at_once():
        return await asyncio.gather(*[exchange(server.port, [Synthesize(TEXT)], "audio-stop") for _ in range(6)])

    expected = spoken(tiny_bundle)
    for answers in asyncio.run(all_at_once()):
        assert np.array_equal(audio_of(answers), expected)


def test_zeroconf_announces_the_torch_free_server_and_sigterm_ends_a_running_synthesis(tiny_bundle, tiny_asr_bundle,
                                                                                        tmp_path):
    """With torch and transformers impossible to import (the `wyoming` extra has neither): a zeroconf (mDNS) lookup,
    as Home Assistant's discovery makes it, here on the loopback interface; a transcription; then a SIGTERM in the
    middle of a synthesis (no frame limit: it would run to the end of the context), which ends at its next frame
    with audio-stop before the server exits 0."""
    from zeroconf.asyncio import AsyncZeroconf

    from helpers import torch_blocked_environment

    running = WyomingServer([tiny_bundle, tiny_asr_bundle], tmp_path / "server.log", "--zeroconf", "vibevoice-test",
                            "--max-new-tokens", str(TOKENS), env=torch_blocked_environment(tmp_path))
    try:
        async def look_up():
            browser = AsyncZeroconf(interfaces=["127.0.0.1"])
            try:
                return await browser.async_get_service_info("_wyoming._tcp.local.",
                                                            "vibevoice-test._wyoming._tcp.local.", 10_000)
            finally:
                await browser.async_close()

        found = asyncio.run(look_up())
        assert found is not None and found.port == running.port
        assert found.parsed_addresses() == ["127.0.0.1"]
        answers = talk(running, transcription_events(speech_like(1.0, 16000, 1), 16000), "transcript")
        assert Transcript.is_type(answers[-1].type)

        async def stopped_mid_speech():
            async with AsyncTcpClient("127.0.0.1", running.port) as client:
                await client.write_event(Synthesize(TEXT).event())
                kinds = [(await asyncio.wait_for(client.read_event(), WAIT)).type for _ in range(2)]
                running.process.send_signal(signal.SIGTERM)
                while (event := await asyncio.wait_for(client.read_event(), WAIT)) is not None:
                    kinds.append(event.type)
                return kinds

        kinds = asyncio.run(stopped_mid_speech())
        assert kinds[:2] == ["audio-start", "audio-chunk"] and kinds[-1] == "audio-stop", kinds
    finally:
        assert running.stop() == 0
    log = (tmp_path / "server.log").read_text()
    assert "only this machine reaches" in log and "blocked import" not in log
