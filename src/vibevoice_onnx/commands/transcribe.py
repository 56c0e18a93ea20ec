"""`vibevoice-onnx transcribe`: audio files in, a transcript each (to standard output or files), or with
--stream one input's chunks printed as they decode. What a transcription may ask is the request layer's
(vibevoice_onnx.requests.TranscriptionRequest)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import VibeVoiceError
from .progress import ProgressLine

TOKENS_PER_UPDATE = 16  # a terminal's progress line is rewritten this often
TOKENS_PER_LOG_LINE = 256  # and a log (a file, a pipe) gets a line this often


def transcribe_files(args) -> int:
    """Each input transcribed in turn; one that fails is reported and the others still get their results."""
    if args.stream:
        return stream_transcription(args)
    if args.realtime or args.sample_rate or args.max_tokens_per_chunk:
        raise VibeVoiceError("--realtime, --sample-rate and --max-tokens-per-chunk go with --stream")
    if "-" in args.audio:
        raise VibeVoiceError("audio from standard input ('-') is streamed: add --stream (with an ASR-Streaming bundle)")
    form = args.format or "json"
    from ..outputs import atomic_file, check_output_file
    from ..requests import TranscriptionRequest, transcribe
    from ..runtime.asr import Transcriber
    from ..transcription import render

    inputs = [Path(a) for a in args.audio]
    several = len(inputs) > 1
    target = Path(args.output) if args.output else None
    if target is not None and several:
        if target.exists() and not target.is_dir():
            raise VibeVoiceError(f"{target}: is a file; with several inputs, -o names a directory")
        target.mkdir(parents=True, exist_ok=True)
    elif target is not None:
        check_output_file(target)
    request = TranscriptionRequest(args.hotwords, args.seed, args.max_new_tokens, args.mean_latents,
                                   args.repetition_guard).check()
    transcriber = Transcriber(Path(args.bundle), threads=args.threads, force=args.force)
    failures = 0
    for path in inputs:
        with ProgressLine() as line:
            def progress(tokens, seconds, name=path.name):
                if tokens % TOKENS_PER_UPDATE == 0:
                    line.update(f"{name}: {tokens} tokens, {tokens / max(seconds, 1e-9):.1f} tokens/s",
                                tokens // TOKENS_PER_LOG_LINE)

            def encoded(done, total, name=path.name):
                line.update(f"{name}: encoded {done} of {total} 60 s segments", ("encoded", done))

            try:
                print(f"{path.name}: encoding", file=sys.stderr, flush=True)
                result = transcribe(transcriber, path, request, progress=progress, on_segment=encoded)
            except VibeVoiceError as e:
                line.done(f"error: {e}")
                failures += 1
                continue
            line.done(f"{path.name}: {len(result.tokens)} tokens, {len(result.segments)} segments, "
                      f"{result.audio_seconds:.2f} s of audio, {result.timings['tokens_per_second']:.1f} tokens/s")
        if result.note:
            print(f"warning: {path.name}: {result.note}", file=sys.stderr)
        text = render(form, result.segments, result.text, result.raw, result.repetition.as_dict())
        if target is None:
            sys.stdout.write(text)
            continue
        out = target / f"{path.stem}.{form}" if several else target
        with atomic_file(out, f"writing the {form} transcript") as partial:
            partial.write_text(text, encoding="utf-8")
    if failures:
        raise VibeVoiceError(f"{failures} of {len(inputs)} input(s) could not be transcribed (see above)")
    return 0


def stream_transcription(args) -> int:
    """`transcribe --stream`: each chunk's text printed as soon as it is decoded (a line each: its span and text,
    or a JSON object with --format json); how long after its audio each came, on standard error."""
    from ..generation.asr_streaming import MAX_TOKENS_PER_CHUNK
    from ..runtime.asr_streaming import StreamingTranscriber, audio_pieces

    if len(args.audio) != 1:
        raise VibeVoiceError("--stream transcribes one input (a file, or '-' for PCM on standard input)")
    form = args.format or "txt"
    if form not in ("txt", "json") or args.output or args.max_new_tokens:
        raise VibeVoiceError("--stream prints each chunk as it comes: --format txt (the default) or json (JSON Lines); "
                             "no -o or --max-new-tokens (see --max-tokens-per-chunk)")
    source = args.audio[0]
    live = StreamingTranscriber(Path(args.bundle), hotwords=args.hotwords, seed=args.seed, mean_latents=args.mean_latents,
                                max_tokens_per_chunk=args.max_tokens_per_chunk or MAX_TOKENS_PER_CHUNK, threads=args.threads,
                                force=args.force, repetition_guard=args.repetition_guard)
    rate = args.sample_rate or live.geometry.sample_rate
    print(f"{source}: {live.geometry.describe()}{'; paced at the speed of speech' if args.realtime else ''}",
          file=sys.stderr, flush=True)
    for piece, due in audio_pieces(source, rate, args.realtime):
        for chunk in live.feed(piece, rate):
            _print_chunk(chunk, form, chunk.ready_at - due)
    for chunk in live.finish():  # the end of the audio is what the last windows waited for
        _print_chunk(chunk, form, chunk.seconds)
    print(f"{len(live.chunks)} chunks, {live.seconds:.2f} s of audio", file=sys.stderr)
    return 0


def _print_chunk(chunk, form: str, latency: float) -> None:
    if form == "json":
        print(json.dumps(chunk.message(), ensure_ascii=False), flush=True)
    else:
        print(f"[{chunk.start:7.2f} - {chunk.end:7.2f}] {chunk.text.strip()}", flush=True)
    print(f"chunk {chunk.index}: text {latency:.2f} s after its audio ({chunk.seconds:.2f} s to decode, "
          f"{len(chunk.tokens)} tokens, {chunk.stop_reason})", file=sys.stderr, flush=True)
    if chunk.repetition.detected:
        print(f"warning: chunk {chunk.index}: {chunk.repetition.describe()}", file=sys.stderr, flush=True)
