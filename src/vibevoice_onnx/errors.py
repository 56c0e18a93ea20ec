"""Errors that the CLI reports as one sentence, without a traceback."""


class VibeVoiceError(Exception):
    """A problem the user can act on: bad input, a file that is not what it claims, a failed gate."""


class CheckpointError(VibeVoiceError):
    """A checkpoint directory that cannot be recognised or read."""


class BundleError(VibeVoiceError):
    """An ONNX bundle that is missing, incomplete or of the wrong kind."""


class StorageFull(VibeVoiceError):
    """A write the file system refused for want of room: a full disk (ENOSPC), a quota (EDQUOT) or a file-size
    limit (EFBIG). What was being written is gone and what was there before is as it was; the server answers 507,
    and a batch job stops here rather than failing every item after."""
