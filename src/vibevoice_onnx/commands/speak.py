"""`vibevoice-onnx speak`: text (realtime) or a script (1.5B) in, 24 kHz audio out, streamed to a WAV file or raw
PCM on stdout. The command line's options become a request (vibevoice_onnx.requests), which decides what the
bundle's kind does with them; this module writes the audio and reports."""

from __future__ import annotations

import codecs
import re
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio import to_pcm16
from ..errors import VibeVoiceError
from ..outputs import atomic_file, check_output_file, os_error_or
from ..requests import SpeechRequest, start_speech
from ..runtime.speech import Speech, open_tts
from ..text import SPEECH_WINDOW, TextCancelled
from .progress import ProgressLine

WAV_SUBTYPES = {"pcm16": "PCM_16", "float32": "FLOAT"}


@dataclass
class SpeakOptions:
    voice: str | None = None  # realtime
    speakers: list[str] | None = None  # 1.5B: "N=VOICE" (or "VOICE" for a script with one speaker)
    voice_latents: str | None = None  # 1.5B: sample (upstream) or mean
    output: Path | None = None
    wav_format: str = "pcm16"
    cfg_scale: float | None = None  # None: the kind's default (1.5 realtime, 1.3 1.5B)
    steps: int | None = None  # None: the kind's default (5 realtime, 10 1.5B)
    seed: int | None = None
    noise: Path | None = None
    save_latents: Path | None = None
    max_frames: int | None = None
    raw: bool = False
    threads: int | None = None
    decode_group: int | None = None  # realtime: frames per decoder call after the first
    force: bool = False  # speak with a bundle that failed or skipped its gates
    stream_input: bool = False  # realtime: speak standard input as it arrives
    turn_gap: float | None = None  # realtime dialogue: seconds of silence between turns


def read_text(text: str | None, text_file: Path | None) -> str:
    if text is not None and text_file is not None:
        raise VibeVoiceError("give the text either as an argument or with -f, not both")
    if text_file is not None:
        try:
            return Path(text_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise VibeVoiceError(f"{text_file}: cannot read the text file ({e})") from None
    if text is not None:
        return text
    if sys.stdin.isatty():
        raise VibeVoiceError("no text: give it as an argument, with -f FILE, or on standard input")
    return sys.stdin.read()


class _AudioSink:
    """Writes chunks as they come: raw PCM on stdout, or a WAV file that replaces its target only when
    generation completes (outputs.atomic_file), so a failed or interrupted run never leaves a truncated file."""

    def __init__(self, options: SpeakOptions, sample_rate: int, outputs: ExitStack):
        self.options, self.clipped, self.file = options, 0, None
        if not options.raw:
            import soundfile as sf

            partial = outputs.enter_context(atomic_file(options.output, "writing the WAV file"))
            with self._wav_errors():
                self.file = sf.SoundFile(str(partial), "w", samplerate=sample_rate, channels=1,
                                         subtype=WAV_SUBTYPES[options.wav_format], format="WAV")
            outputs.callback(self._close)

    @contextmanager
    def _wav_errors(self):
        import soundfile as sf

        try:
            yield
        except sf.LibsndfileError as e:  # libsndfile reports a full disk or a size limit as "System error"
            raise os_error_or(e, f"{self.options.output}: writing the WAV file failed ({e}; is the disk full?)") from None

    def _close(self) -> None:
        with self._wav_errors():
            self.file.close()

    def write(self, samples: np.ndarray) -> None:
        if self.options.wav_format == "pcm16":
            self.clipped += int(np.count_nonzero(np.abs(samples) > 1.0))
        # 16-bit samples are quantised here (not by libsndfile, whose rounding differs between versions), so a
        # WAV file, raw output and the server's audio hold the same integers.
        data = to_pcm16(samples) if self.options.wav_format == "pcm16" else samples.astype("<f4")
        if self.file is not None:
            with self._wav_errors():
                self.file.write(data)
            return
        sys.stdout.buffer.write(data.tobytes())
        sys.stdout.buffer.flush()


def _progress(progress: ProgressLine, speech: Speech, final: bool = False) -> None:
    """The run so far; off a terminal a line per speech window (6 frames) and a last one where it fell between."""
    audio = speech.audio_seconds
    rtf = speech.seconds / audio if audio else float("nan")
    frames = speech.result.frames
    line = f"frame {frames:5d}  audio {audio:7.2f} s  wall {speech.seconds:7.2f} s  RTF {rtf:.3f}"
    if speech.segments > 1:
        line += f"  segment {max(1, len(speech.result.segments))}/{speech.segments}"
    step = frames // SPEECH_WINDOW if frames % SPEECH_WINDOW == 0 else None
    (progress.done if final else progress.update)(line, step)


def parse_speakers(values: list[str]) -> dict:
    """`--speaker N=VOICE` values as {N: VOICE}; a bare VOICE is keyed None (a script with one speaker)."""
    given: dict = {}
    for value in values:
        match = re.fullmatch(r"(\d+)=(.+)", value)
        number, voice = (int(match.group(1)), match.group(2)) if match else (None, value)
        if number in given:
            raise VibeVoiceError(f"--speaker {value}: " + ("a voice without a number is already given" if number is None
                                                         else f"Speaker {number} already has a voice"))
        given[number] = voice
    return given


def speech_request(text: str | None, options: SpeakOptions) -> SpeechRequest:
    """The command line's options as the request layer's request."""
    return SpeechRequest(
        text, voice=options.voice, speakers=parse_speakers(options.speakers) if options.speakers else None,
        cfg_scale=options.cfg_scale, steps=options.steps, seed=options.seed, max_frames=options.max_frames,
        turn_gap=options.turn_gap, voice_latents=options.voice_latents, decode_group=options.decode_group,
        noise=options.noise, text_stream=options.stream_input)


def _feed_stdin(speech, failures: list) -> None:
    """Feed standard input to a text stream as it arrives (an LLM piping its answer), then finish it. A text that
    cannot be spoken (nothing in it to speak) stops the generation, and `failures` holds why."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    try:
        while piece := stdin.read(4096):
            speech.feed(decoder.decode(piece))
        speech.feed(decoder.decode(b"", final=True))
        speech.finish()
    except VibeVoiceError as e:
        failures.append(e)
        speech.close()


def speak(bundle_dir: Path, text: str | None, options: SpeakOptions) -> dict:
    """`vibevoice-onnx speak`: open the bundle, speak `text` as `options` say, report on standard error."""
    for path in (None if options.raw else options.output, options.save_latents):
        if path is not None:
            check_output_file(path)
    load_start = time.perf_counter()
    tts = open_tts(bundle_dir, threads=options.threads, force=options.force)
    return speak_with(tts, speech_request(text, options), options,
                      log=lambda line: print(line, file=sys.stderr, flush=True), load_start=load_start)


def speak_with(tts, request: SpeechRequest, options: SpeakOptions, log=None, load_start: float | None = None) -> dict:
    """Speak `request` on an open model, the audio written as `options` say (their output, format and latents
    file), as it comes and committed only when complete; `log(line)` hears what is being done (and the
    progress), None: nothing is printed."""
    load_start = time.perf_counter() if load_start is None else load_start
    started = start_speech(tts, request)
    speech, described, preparing = started.speech, started.described, started.preparing
    feeding_failed: list[VibeVoiceError] = []
    if request.text_stream:
        threading.Thread(target=_feed_stdin, args=(speech, feeding_failed), daemon=True).start()
    load_seconds = time.perf_counter() - load_start
    randomness = [f"seed {speech.seed}"] if speech.seed is not None else []
    if options.noise is not None:
        randomness.append(f"noise {options.noise}")
    if log is not None:
        log(", ".join([described, *randomness]))
        if preparing:
            log(preparing)
        if speech.segments > 1:
            log(f"the text is longer than the model's context: spoken in {speech.segments} segments cut at sentence "
                "ends, each from the voice prompt, the audio streamed on without a seam")
    speech.result.keep_audio = False  # written as it comes: a long text's audio is not held
    with ExitStack() as outputs, ProgressLine() as progress:  # the files are committed together, if it completes
        sink = _AudioSink(options, tts.sample_rate, outputs)
        try:
            for chunk in speech:
                sink.write(chunk.samples)
                if log is not None:
                    _progress(progress, speech)
        except TextCancelled:
            if feeding_failed:  # the generation stopped because its text could not be read: say why
                raise feeding_failed[0] from None
            raise
        if options.save_latents is not None:
            with open(outputs.enter_context(atomic_file(options.save_latents, "saving the latents")), "wb") as f:
                np.save(f, np.asarray(speech.result.latents, np.float32).reshape(-1, tts.latent_size))
        if log is not None:
            _progress(progress, speech, final=True)
    audio = speech.audio_seconds
    return {
        "voices": described,
        "seed": speech.seed,
        "frames": speech.result.frames,
        "stop": speech.result.stop_reason,
        "audio_seconds": round(audio, 3),
        "wall_seconds": round(speech.seconds, 3),
        "load_seconds": round(load_seconds, 3),
        "real_time_factor": round(speech.seconds / audio, 4) if audio else None,
        "first_audio_seconds": round(speech.first_chunk_seconds, 4) if speech.first_chunk_seconds is not None else None,
        "clipped_samples": sink.clipped,
        "output": None if options.raw else str(options.output),
    }


def speak_command(args) -> int:
    """`vibevoice-onnx speak` as parsed: speak, then report the run on standard error."""
    if args.raw and args.output:
        raise VibeVoiceError("--raw writes to standard output; do not combine it with -o")
    options = SpeakOptions(
        voice=args.voice, speakers=args.speaker, voice_latents=args.voice_latents,
        output=Path(args.output or "speech.wav"), wav_format=args.wav_format,
        cfg_scale=args.cfg_scale, steps=args.steps, seed=args.seed, noise=Path(args.noise) if args.noise else None,
        save_latents=Path(args.save_latents) if args.save_latents else None, max_frames=args.max_frames,
        raw=args.raw, threads=args.threads, decode_group=args.decode_group, force=args.force,
        stream_input=args.stream_input, turn_gap=args.turn_gap,
    )
    if args.stream_input and (args.text is not None or args.file):
        raise VibeVoiceError("--stream-input reads the text from standard input; give no TEXT or -f")
    text = None if args.stream_input else read_text(args.text, Path(args.file) if args.file else None)
    summary = speak(Path(args.bundle), text, options)
    lines = [
        f"frames {summary['frames']} ({summary['stop']}), audio {summary['audio_seconds']:.2f} s, "
        f"wall {summary['wall_seconds']:.2f} s, real-time factor {summary['real_time_factor']}, "
        f"first audio after {summary['first_audio_seconds']} s",
    ]
    if summary["clipped_samples"]:
        lines.append(f"warning: {summary['clipped_samples']} samples beyond ±1 were clipped (--wav-format float32 keeps them)")
    if summary["output"]:
        lines.append(f"wrote {summary['output']}")
    print("\n".join(lines), file=sys.stderr)
    return 0
