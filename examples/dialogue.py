"""A two-speaker dialogue with a 1.5B (or Large) bundle: a `Speaker N:` script, each voice cloned from audio.

    python examples/dialogue.py BUNDLE dialogue.wav --speaker 1=alice --speaker 2=samples/bob.flac

A speaker's voice is a voice imported into the bundle (`vibevoice-onnx voices import`) or any audio file.
"""

import argparse

import soundfile as sf

from vibevoice_onnx.runtime.speech import open_tts

SCRIPT = """Speaker 1: Welcome back to the show. Today we talk about speech models.
Speaker 2: Thanks for having me. It is lovely to be here.
Speaker 1: Let us start with the basics."""

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("bundle")
parser.add_argument("out", help="the WAV file to write")
parser.add_argument("--speaker", action="append", required=True, metavar="N=VOICE")
parser.add_argument("--script", default=SCRIPT, help="the script (default: a short two-speaker one)")
parser.add_argument("--max-frames", type=int, default=None)
args = parser.parse_args()

speakers = {int(number): voice for number, voice in (spec.split("=", 1) for spec in args.speaker)}
tts = open_tts(args.bundle, threads=2)  # LongFormTTS or LargeTTS, as the bundle's kind says
speech = tts.stream(args.script, speakers=speakers, seed=7, max_frames=args.max_frames)
for chunk in speech:  # one 3200-sample chunk per latent, as it decodes
    pass
sf.write(args.out, speech.result.audio, tts.sample_rate)
print(f"{args.out}: {len(speech.result.audio) / tts.sample_rate:.2f} s, stopped by {speech.result.stop_reason}")
