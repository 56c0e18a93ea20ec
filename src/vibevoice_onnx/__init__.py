"""VibeVoice speech models as ONNX bundles, run with onnxruntime.

    import vibevoice_onnx
    tts = vibevoice_onnx.open("path/to/bundle")      # or a checkpoint directory, or a Hub id ORG/NAME[@REV]
    audio, rate = tts.create("Hello there.", voice="en-Davis_man")

Importing the package loads nothing heavy: `open` imports the runtime when it is called."""


def open(ref, *, precision=None, device=None, revision=None, tokenizer=None, threads=None, force=False):  # noqa: A001
    """The runtime object for a model reference: a bundle directory, a checkpoint directory (built and verified
    into the bundle cache on first use: the export extra), or a Hub repository id ORG/NAME[@REVISION]. By the
    bundle's kind: RealtimeTTS, LongFormTTS, LargeTTS, Transcriber or StreamingModel. `precision` and `device`
    pick the bundle a checkpoint is built into; `force` opens a bundle that failed or skipped its gates."""
    from .runtime.pretrained import open_model

    return open_model(ref, precision=precision, device=device, revision=revision, tokenizer=tokenizer,
                      threads=threads, force=force)


__all__ = ["open"]
