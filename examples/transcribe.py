"""Transcribe an audio file with an ASR bundle: speakers, timestamps and text, written as JSON.

    python examples/transcribe.py BUNDLE meeting.wav meeting.json --hotwords "Zorblax, Quentin"

The audio may be any format soundfile reads, at any rate and channel count. A synthetic (random-weight) bundle
writes no JSON transcript; then `segments` is empty and `note` says why.
"""

import argparse
import dataclasses
import json

from vibevoice_onnx.runtime.asr import Transcriber

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("bundle")
parser.add_argument("audio")
parser.add_argument("out", help="the JSON file to write")
parser.add_argument("--hotwords", default=None)
parser.add_argument("--max-new-tokens", type=int, default=512)
args = parser.parse_args()

transcript = Transcriber(args.bundle, threads=2).transcribe(args.audio, hotwords=args.hotwords, seed=0,
                                                            max_new_tokens=args.max_new_tokens)
with open(args.out, "w") as out:
    json.dump({"text": transcript.text, "segments": [dataclasses.asdict(s) for s in transcript.segments],
               "note": transcript.note, "audio_seconds": transcript.audio_seconds}, out, indent=2)
print(f"{args.out}: {len(transcript.tokens)} tokens, {len(transcript.segments)} segments")
