"""Errors that the CLI reports as one sentence, without a traceback."""


class VibeVoiceError(Exception):
    """A problem the user can act on: bad input, a file that is not what it claims, a failed gate."""


class CheckpointError(VibeVoiceError):
    """A checkpoint directory that cannot be recognised or read."""


class BundleError(VibeVoiceError):
    """An ONNX bundle that is missing, incomplete or of the wrong kind."""
