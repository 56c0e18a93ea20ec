"""Speak an LLM's answer while it is still being written: text arrives piece by piece into a realtime bundle.

    python examples/llm_stream.py BUNDLE answer.wav --voice en-Davis_man

`text_stream` runs each 5-token text window as soon as it is complete, so the audio starts before the text is
finished; with the same seed it equals the audio of the whole text given at once. `fake_llm` stands in for a
real model's streamed tokens (an OpenAI client's `stream=True` deltas go in the same way).
"""

import argparse
import threading
import time

import numpy as np
import soundfile as sf

from vibevoice_onnx.runtime.realtime import RealtimeTTS


def fake_llm():
    for piece in "Sure. Here is the answer you asked for, spoken while it is being written.".split(" "):
        time.sleep(0.05)  # a token's latency
        yield piece + " "


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("bundle")
parser.add_argument("out", help="the WAV file to write")
parser.add_argument("--voice", default=None, help="a voice of the bundle (default: its first)")
parser.add_argument("--max-frames", type=int, default=None)
args = parser.parse_args()

tts = RealtimeTTS(args.bundle, threads=2)
speech = tts.text_stream(voice=args.voice or tts.voices[0], seed=7, max_frames=args.max_frames)
feeder = threading.Thread(target=lambda: ([speech.feed(piece) for piece in fake_llm()], speech.finish()))
feeder.start()
chunks = [chunk.samples for chunk in speech]  # each chunk as soon as it decodes (play it here instead)
feeder.join()
sf.write(args.out, np.concatenate(chunks), tts.sample_rate)
print(f"{args.out}: {len(chunks)} chunks, first audio after {speech.first_chunk_seconds:.2f} s")
