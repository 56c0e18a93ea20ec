"""Audio out as one stream per response, audio in from any upload: PyAV (FFmpeg with LAME and libopus in its
wheels) for the compressed formats, plain bytes for pcm and wav.

One encoder and one container live for the whole response, so a streamed MP3, Ogg Opus or AAC is a single
valid stream (no containers glued at chunk seams, no lost tails): each `encode` returns the bytes the muxer
has written so far, `finish` flushes the resampler, the encoder and the container's trailer.

FLAC alone is sent whole when the audio ends: a streamed FLAC must say "length unknown" in its STREAMINFO,
which libsndfile (soundfile) cannot read, while at the end the muxer writes the length and the MD5 there.
WAV streams with sizes of 0xFFFFFFFF, which soundfile, FFmpeg and browsers accept.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from ..audio import SAMPLE_RATE, to_pcm16

# OpenAI's response formats and the content types their API answers with.
FORMATS = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

# format: (container, codec, codec sample format, output rate, bit rate, muxer options, encoder options). LAME's own
# default at 24 kHz is 32 kbit/s, audibly poor; 96 kbit/s keeps mp3 and aac within a few percent of the waveform.
# LAME's quality is set, not left to the build: at its default (3, psychoacoustic noise shaping) PyAV 18.1.0's
# LAME kept white noise at 0.96 correlation and 18.1.1's at 0.88, the same bytes a second; at 7 (no noise
# shaping) both keep 0.96, and at 96 kbit/s for 24 kHz mono the bits are ample without it.
_FFMPEG = {
    "mp3": ("mp3", "libmp3lame", "s16p", SAMPLE_RATE, 96_000, {"write_xing": "0"},  # no Xing: iOS plays it streamed
            {"compression_level": "7"}),
    "opus": ("ogg", "libopus", "s16", 48_000, 64_000, {"page_duration": "40000"}, {}),  # 40 ms pages: it streams
    "aac": ("adts", "aac", "fltp", SAMPLE_RATE, 96_000, {}, {}),  # ADTS: each frame self-framed, playable as it streams
    "flac": ("flac", "flac", "s16", SAMPLE_RATE, None, {}, {}),
}
SENT_WHOLE = {"flac"}
UNKNOWN_SIZE = 0xFFFFFFFF  # what a streamed WAV says for sizes not yet known (OpenAI sends the same)


def wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A 44-byte RIFF header for 16-bit mono PCM of unknown length."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", UNKNOWN_SIZE)


class _Drain:
    """A write-only file for the muxer: what it wrote, taken away as it is sent. Having no seek, it keeps
    muxers from going back to patch headers, so the bytes sent are final."""

    def __init__(self):
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


class StreamEncoder:
    """24 kHz float samples in, the bytes of one response_format stream out, chunk by chunk."""

    def __init__(self, fmt: str, sample_rate: int = SAMPLE_RATE):
        if fmt not in FORMATS:
            raise ValueError(f"unknown audio format {fmt!r}; choose from {', '.join(FORMATS)}")
        self.fmt, self.sample_rate, self.samples = fmt, sample_rate, 0
        self.header = wav_header(sample_rate) if fmt == "wav" else b""
        if fmt in _FFMPEG:
            self._open(*_FFMPEG[fmt])

    def _open(self, container: str, codec: str, sample_format: str, rate: int, bit_rate: int | None,
              options: dict, encoder_options: dict) -> None:
        import av

        self._drain = io.BytesIO() if self.fmt in SENT_WHOLE else _Drain()  # seekable: the muxer patches the header
        self._container = av.open(self._drain, mode="w", format=container, options=options)
        self._stream = self._container.add_stream(codec, rate=rate, layout="mono")
        self._stream.format = sample_format
        if bit_rate:
            self._stream.codec_context.bit_rate = bit_rate
        self._stream.codec_context.options = encoder_options
        self._stream.codec_context.open()  # fixes frame_size, which the resampler must cut frames to
        frame_size = self._stream.codec_context.frame_size or None
        self._resampler = av.AudioResampler(format=sample_format, layout="mono", rate=rate, frame_size=frame_size)

    def encode(self, samples: np.ndarray) -> bytes:
        pcm = to_pcm16(samples)
        header, self.header = self.header, b""
        if self.fmt in ("pcm", "wav"):
            return header + pcm.tobytes()
        return self._mux(self._frame(pcm))

    def finish(self) -> bytes:
        """The stream's tail: buffered samples, the encoder's delay, the container's trailer."""
        if self.fmt in ("pcm", "wav"):
            header, self.header = self.header, b""
            return header  # an empty response is still a WAV file with its header
        tail = self._mux(None)
        self._container.close()
        return self._drain.getvalue() if self.fmt in SENT_WHOLE else tail + self._drain.take()

    def _frame(self, pcm: np.ndarray):
        import av

        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = self.sample_rate, self.samples
        self.samples += len(pcm)
        return frame

    def _mux(self, frame) -> bytes:
        """Resample (None flushes), encode (None after a flush drains the encoder) and mux."""
        for resampled in self._resampler.resample(frame):
            self._container.mux(self._stream.encode(resampled))
        if frame is None:
            self._container.mux(self._stream.encode(None))
        return b"" if self.fmt in SENT_WHOLE else self._drain.take()


def decode_upload(path: str) -> tuple[np.ndarray, int]:
    """float32 mono samples (the channel mean) at the file's own rate. soundfile first, as `transcribe` reads
    files, so an upload it reads gives the CLI's samples exactly; PyAV for the rest (m4a, aac, opus, webm...).
    ValueError with the decoders' reasons when neither reads it."""
    try:
        return _soundfile(path)
    except Exception as first:  # noqa: BLE001 - any failure means: try the other decoder
        try:
            return _pyav(path)
        except Exception as second:  # noqa: BLE001
            raise ValueError(f"{_reason(first)}; {_reason(second)}") from None


def _soundfile(path: str) -> tuple[np.ndarray, int]:
    import soundfile as sf

    data, rate = sf.read(path, dtype="float32", always_2d=True)
    return _mono(data.T), int(rate)


def _pyav(path: str) -> tuple[np.ndarray, int]:
    import av

    with av.open(path) as container:
        if not container.streams.audio:
            raise ValueError("no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="fltp", layout=stream.layout.name)
        planes = [resampled.to_ndarray() for frame in container.decode(stream) for resampled in resampler.resample(frame)]
        planes += [resampled.to_ndarray() for resampled in resampler.resample(None)]
        rate = stream.codec_context.sample_rate
    if not planes:
        return np.zeros(0, np.float32), int(rate or SAMPLE_RATE)
    return _mono(np.concatenate(planes, axis=1)), int(rate)


def _mono(channels: np.ndarray) -> np.ndarray:
    channels = np.asarray(channels, np.float32)
    mono = channels.mean(axis=0, dtype=np.float32) if channels.shape[0] > 1 else channels[0]
    return np.ascontiguousarray(mono, dtype=np.float32)


def _reason(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
