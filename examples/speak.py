"""Speak one sentence into a WAV file with a realtime bundle (torch-free: onnxruntime and numpy only).

    python examples/speak.py BUNDLE "Hello there." hello.wav --voice en-Davis_man

BUNDLE is a built realtime bundle (e.g. onnx/realtime/cpu_int8) with the voice imported; `--max-frames` caps the
length (7.5 frames a second), which a synthetic checkpoint needs: it never learned when to stop.
"""

import argparse

import soundfile as sf

from vibevoice_onnx.runtime.realtime import RealtimeTTS

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("bundle")
parser.add_argument("text")
parser.add_argument("out", help="the WAV file to write")
parser.add_argument("--voice", default=None, help="a voice of the bundle (default: its first)")
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--max-frames", type=int, default=None)
args = parser.parse_args()

tts = RealtimeTTS(args.bundle, threads=2)
voice = args.voice or tts.voices[0]
audio, sample_rate = tts.create(args.text, voice=voice, seed=args.seed, max_frames=args.max_frames)
sf.write(args.out, audio, sample_rate)
print(f"{args.out}: {len(audio) / sample_rate:.2f} s of audio at {sample_rate} Hz, voice {voice}")
