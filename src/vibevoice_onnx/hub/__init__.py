"""From a model id to a bundle: Hub repositories (checkpoints, prebuilt bundles, tokenizers), plain URLs (voices),
and the cache of bundles built from checkpoints. Torch-free, except that building a checkpoint imports the
export extra when, and only when, a build is needed."""

from .resolve import resolve_bundle

__all__ = ["resolve_bundle"]
