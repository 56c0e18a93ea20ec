"""`from_pretrained`: every model class of the API opened from a model reference, as Hub users expect."""

from __future__ import annotations

from pathlib import Path


class FromPretrained:
    @classmethod
    def from_pretrained(cls, ref: str | Path, precision: str | None = None, device: str | None = None,
                        revision: str | None = None, tokenizer: str | Path | None = None, **options):
        """Open `ref`: a bundle directory, a checkpoint directory, or a Hub repository id (ORG/NAME[@REVISION]) of
        an upstream checkpoint or a prebuilt bundle. A checkpoint is built and verified into the bundle cache on
        first use, at `precision` (default: the fastest whose gates pass, int8 on a CPU) for `device` (default cpu); a prebuilt bundle
        is downloaded and its files checked. `options` go to the class (threads, force, ...)."""
        from ..hub import resolve_bundle

        return cls(resolve_bundle(ref, precision=precision, device=device, revision=revision, tokenizer=tokenizer),
                   **options)


def open_model(ref: str | Path, precision: str | None = None, device: str | None = None, revision: str | None = None,
               tokenizer: str | Path | None = None, threads: int | None = None, force: bool = False):
    """The runtime object for any model reference (`vibevoice_onnx.open`): resolved as `from_pretrained` and the
    command line resolve it, then opened as its bundle's kind says: RealtimeTTS, LongFormTTS, LargeTTS,
    Transcriber (asr, asr-hf) or StreamingModel (asr-streaming)."""
    from ..families import family, load
    from ..hub import resolve_bundle
    from .bundle import Bundle

    bundle = Bundle(resolve_bundle(ref, precision=precision, device=device, revision=revision, tokenizer=tokenizer),
                    threads=threads)
    return load(family(bundle.kind).runtime)(bundle, force=force)
