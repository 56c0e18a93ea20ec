"""serve.codec: one stream per response whatever the chunking, and uploads in any format PyAV or soundfile read."""

import io
import struct

import numpy as np
import pytest

pytest.importorskip("av")

from vibevoice_onnx.audio import to_pcm16  # noqa: E402
from vibevoice_onnx.serve.codec import FORMATS, StreamEncoder, decode_upload  # noqa: E402

RATE = 24000


def tone(seconds: float = 2.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.4 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 3 * t + 0.3)).astype(np.float32)


def encoded(fmt: str, samples: np.ndarray, chunk: int = 3200) -> list[bytes]:
    encoder = StreamEncoder(fmt)
    return [encoder.encode(samples[i:i + chunk]) for i in range(0, len(samples), chunk)] + [encoder.finish()]


def av_decoded(data: bytes) -> tuple[np.ndarray, int]:
    import av

    with av.open(io.BytesIO(data)) as container:
        assert len(container.streams.audio) == 1
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        frames = [f.to_ndarray().reshape(-1) for frame in container.decode(stream) for f in resampler.resample(frame)]
        frames += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
        return np.concatenate(frames), stream.codec_context.sample_rate


def test_pcm16_is_clipped_and_symmetric():
    samples = np.array([0.0, 1.0, -1.0, 2.5, -2.5, 0.5, 1.5 / 32767, np.float32(0.49 / 32767)], np.float32)
    assert to_pcm16(samples).tolist() == [0, 32767, -32767, 32767, -32767, 16384, 2, 0]
    assert to_pcm16(samples).dtype == np.dtype("<i2")


def test_pcm_is_the_samples_whatever_the_chunking():
    samples = tone(0.5)
    assert b"".join(encoded("pcm", samples, chunk=777)) == to_pcm16(samples).tobytes()


def test_wav_streams_a_header_of_unknown_size_that_soundfile_reads():
    import soundfile as sf

    samples = tone(0.5)
    parts = encoded("wav", samples, chunk=1000)
    data = b"".join(parts)
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
    assert struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert struct.unpack("<HHIIHH", data[20:36]) == (1, 1, RATE, RATE * 2, 2, 16)
    assert len(parts[0]) == 44 + 2000  # the header goes out with the first chunk, not held back
    read, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == RATE and np.array_equal(read, to_pcm16(samples))


def test_an_empty_wav_stream_is_still_a_header():
    assert len(StreamEncoder("wav").finish()) == 44


def test_flac_is_lossless_and_whole_with_its_length_in_the_header():
    import soundfile as sf

    samples = tone(1.0)
    parts = encoded("flac", samples, chunk=1234)
    assert not any(parts[:-1])  # sent whole at the end, so that STREAMINFO holds the length
    decoded, rate = av_decoded(parts[-1])
    assert rate == RATE
    assert np.array_equal(np.round(decoded * 32768).astype(np.int16), to_pcm16(samples))
    info = sf.info(io.BytesIO(parts[-1]))
    assert info.frames == len(samples)
    read, _ = sf.read(io.BytesIO(parts[-1]), dtype="int16")
    assert np.array_equal(read, to_pcm16(samples))


@pytest.mark.parametrize("fmt,rate", [("mp3", 24000), ("opus", 48000), ("aac", 24000)])
def test_lossy_streams_are_one_stream_with_the_whole_waveform(fmt, rate):
    samples = tone(2.0)
    parts = encoded(fmt, samples)
    decoded, stream_rate = av_decoded(b"".join(parts))
    assert stream_rate == rate
    assert 0 <= len(decoded) - len(samples) < 0.1 * RATE  # the encoder's priming, never a lost tail
    lag = int(np.argmax(np.correlate(decoded[:6000], samples[:4000], "valid")))
    aligned = decoded[lag:lag + len(samples)]
    assert len(aligned) == len(samples)
    assert np.corrcoef(aligned, samples)[0, 1] > 0.99
    last = slice(len(samples) - 2400, len(samples))  # the last 100 ms survive the flush
    assert np.abs(aligned[last]).max() > 0.8 * np.abs(samples[last]).max()
    # streamed: most of the bytes are out before finish(), and no chunk after the first few is held back
    assert sum(map(len, parts[:-1])) > 0.8 * sum(map(len, parts))
    assert all(len(p) > 0 for p in parts[2:-1])


def test_mp3_has_no_xing_header():
    data = b"".join(encoded("mp3", tone(0.5)))
    assert b"Xing" not in data[:4096] and b"Info" not in data[:4096]


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match=r"^unknown audio format 'ogg'; choose from mp3, opus, aac, flac, wav, pcm$"):
        StreamEncoder("ogg")
    assert set(FORMATS) == {"mp3", "opus", "aac", "flac", "wav", "pcm"}


def test_uploads_decode_from_soundfile_formats_as_transcribe_reads_them(tmp_path):
    import soundfile as sf

    stereo = np.stack([tone(0.5), -0.5 * tone(0.5)], axis=1)
    path = tmp_path / "stereo.wav"
    sf.write(path, stereo, 16000, subtype="FLOAT")
    samples, rate = decode_upload(str(path))
    assert rate == 16000
    np.testing.assert_array_equal(samples, stereo.mean(axis=1, dtype=np.float32))


def test_uploads_decode_m4a_through_pyav(tmp_path):
    import av

    samples = tone(1.0)
    path = tmp_path / "speech.m4a"
    with av.open(str(path), "w", format="ipod") as container:
        stream = container.add_stream("aac", rate=RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = RATE
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    decoded, rate = decode_upload(str(path))
    assert rate == RATE
    assert abs(len(decoded) - len(samples)) < 0.1 * RATE
    assert np.abs(decoded).max() > 0.3


@pytest.mark.parametrize("content", [b"", b"this is not audio at all" * 100, b"RIFF\x00\x00\x00\x00WAVE"])
def test_undecodable_uploads_are_a_value_error(tmp_path, content):
    path = tmp_path / "upload.bin"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        decode_upload(str(path))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_lossy_bit_rates_keep_broadband_audio(fmt):
    """Random-weight models speak noise: at LAME's default 32 kbit/s an mp3 of it correlates 0.7 with the input."""
    noise = (np.random.default_rng(0).standard_normal(2 * RATE) * 0.1).astype(np.float32)
    decoded, _ = av_decoded(b"".join(encoded(fmt, noise)))
    lag = int(np.argmax(np.correlate(decoded[:6000], noise[:4000], "valid")))
    assert np.corrcoef(decoded[lag:lag + len(noise)], noise)[0, 1] > 0.9


def first_line(call) -> str:
    """How an upload's refusal words what `call` raises (serve.codec's `_reason`, held to its own test below)."""
    from vibevoice_onnx.serve.codec import _reason

    try:
        call()
    except Exception as error:  # noqa: BLE001
        return _reason(error)
    raise AssertionError("it did not fail")


def soundfile_refuses(path):
    raise RuntimeError("refused")


def test_what_soundfile_reads_it_decodes_without_pyav(tmp_path, monkeypatch):
    """soundfile first, so an upload gives the samples `transcribe` reads from the same file, whatever PyAV
    would make of it: here PyAV is out of reach."""
    import soundfile as sf

    from vibevoice_onnx.serve import codec

    monkeypatch.setattr(codec, "_pyav", lambda path: pytest.fail("PyAV asked for a file soundfile reads"))
    stereo = np.stack([tone(0.25), -0.5 * tone(0.25)], axis=1)
    sf.write(tmp_path / "stereo.flac", stereo, 16000, subtype="PCM_16")
    samples, rate = decode_upload(str(tmp_path / "stereo.flac"))
    read, _ = sf.read(tmp_path / "stereo.flac", dtype="float32")
    assert rate == 16000 and samples.dtype == np.float32 and samples.flags.c_contiguous
    np.testing.assert_array_equal(samples, read.mean(axis=1, dtype=np.float32))
    sf.write(tmp_path / "one.wav", np.array([[0.5, -0.25]], np.float32), 8000, subtype="FLOAT")  # a single frame
    assert decode_upload(str(tmp_path / "one.wav"))[0].tolist() == [0.125]
    sf.write(tmp_path / "mono.wav", tone(0.1), 8000, subtype="PCM_16")
    mono, _ = sf.read(tmp_path / "mono.wav", dtype="float32")
    np.testing.assert_array_equal(decode_upload(str(tmp_path / "mono.wav"))[0], mono)


def test_what_soundfile_cannot_read_pyav_decodes_to_the_same_samples(tmp_path, monkeypatch):
    """PyAV's path alone (soundfile made to refuse): a 16-bit stereo WAV gives soundfile's samples, the channels'
    mean in float32 at the file's rate."""
    import soundfile as sf

    from vibevoice_onnx.serve import codec

    monkeypatch.setattr(codec, "_soundfile", soundfile_refuses)
    stereo = np.stack([tone(0.25), -0.5 * tone(0.25)], axis=1)
    sf.write(tmp_path / "stereo.wav", stereo, 16000, subtype="PCM_16")
    samples, rate = decode_upload(str(tmp_path / "stereo.wav"))
    read, _ = sf.read(tmp_path / "stereo.wav", dtype="float32")
    assert rate == 16000 and samples.dtype == np.float32
    np.testing.assert_allclose(samples, read.mean(axis=1), atol=1e-7)


def test_only_the_first_audio_stream_of_an_upload_is_heard(tmp_path):
    import av

    path = tmp_path / "two.mka"
    first, second = tone(0.5), -tone(0.5)[::-1]
    with av.open(str(path), "w", format="matroska") as container:
        streams = [container.add_stream("pcm_s16le", rate=RATE, layout="mono") for _ in range(2)]
        for stream, samples in zip(streams, (first, second)):
            frame = av.AudioFrame.from_ndarray(to_pcm16(samples).reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = RATE
            container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
    decoded, rate = decode_upload(str(path))
    assert rate == RATE and len(decoded) == len(first)
    np.testing.assert_allclose(decoded, to_pcm16(first) / 32768, atol=1e-6)


def test_an_audio_stream_with_nothing_in_it_is_no_samples_at_its_rate(tmp_path, monkeypatch):
    """Through PyAV (soundfile made to refuse): an empty 16 kHz WAV."""
    import soundfile as sf

    from vibevoice_onnx.serve import codec

    monkeypatch.setattr(codec, "_soundfile", soundfile_refuses)
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.float32), 16000)
    samples, rate = decode_upload(str(tmp_path / "empty.wav"))
    assert samples.dtype == np.float32 and samples.shape == (0,) and rate == 16000


def test_an_upload_with_no_audio_says_so_with_each_decoders_reason(tmp_path):
    import av
    import soundfile as sf

    path = tmp_path / "video.mkv"
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("mpeg4", rate=1)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for _ in range(2):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
                                        .reformat(format="yuv420p")))
        container.mux(stream.encode(None))
    with pytest.raises(ValueError) as refused:
        decode_upload(str(path))
    assert str(refused.value) == f"{first_line(lambda: sf.read(str(path)))}; no audio stream"


def test_a_refusal_names_each_decoders_first_line_or_its_errors_type(tmp_path):
    import av
    import soundfile as sf

    from vibevoice_onnx.serve.codec import _reason

    path = tmp_path / "upload.bin"
    path.write_bytes(b"this is not audio at all\nsecond line" * 10)
    with pytest.raises(ValueError) as refused:
        decode_upload(str(path))
    assert str(refused.value) == f"{first_line(lambda: sf.read(str(path)))}; {first_line(lambda: av.open(str(path)))}"
    assert _reason(OSError("first\nsecond")) == "first" and _reason(KeyError()) == "KeyError"


def test_a_stream_starts_at_time_zero():
    """Ogg Opus carries time stamps: the first sample is at 0, so a player shows no offset."""
    import av

    with av.open(io.BytesIO(b"".join(encoded("opus", tone(0.5))))) as container:
        assert container.streams.audio[0].start_time == 0
