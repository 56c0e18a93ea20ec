"""Numeric options and their meaningful ranges: one table for the Python API and the command line."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from .errors import VibeVoiceError


@dataclass(frozen=True)
class Limit:
    low: float
    high: float | None  # None: no upper bound
    whole: bool

    def describe(self) -> str:
        kind, show = ("a whole number", lambda v: str(int(v))) if self.whole else ("a number", lambda v: f"{v:g}")
        return f"{kind} of at least {show(self.low)}" if self.high is None else f"{kind} from {show(self.low)} to {show(self.high)}"


LIMITS = {
    "seed": Limit(0, 2**63 - 1, True),  # numpy seeds are non-negative
    "cfg_scale": Limit(0.0, 20.0, False),  # 1.0 is no guidance; upstream demos use 1.3 and 1.5
    "steps": Limit(1, 999, True),  # 1000 training steps give at most 999 distinct inference timesteps
    "max_frames": Limit(1, None, True),
    "threads": Limit(1, 1024, True),
    "decode_group": Limit(1, 64, True),  # realtime: frames decoded per call after the first
    "max_new_tokens": Limit(1, 131072, True),  # ASR: tokens generated at most
    "turn_gap": Limit(0.0, 60.0, False),  # realtime dialogue: seconds of silence between turns
    "max_streams": Limit(1, 256, True),  # generations batched on one model
    "sample_rate": Limit(1000, 768000, True),  # Hz of raw audio handed over
    "max_tokens_per_chunk": Limit(1, 2048, True),  # ASR-Streaming: text tokens per chunk (upstream's server caps 2048)
    "port": Limit(0, 65535, True),  # TCP; 0: any free one (the server says which)
}


def check(name: str, value, label: str | None = None):
    """Return `value` if it lies in the range of option `name`, else raise a sentence that gives the range."""
    limit = LIMITS[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and value >= limit.low and (limit.high is None or value <= limit.high)
    ok = ok and (not limit.whole or float(value).is_integer())
    if not ok:
        raise VibeVoiceError(f"{label or name} must be {limit.describe()}, got {value!r}")
    return int(value) if limit.whole else float(value)


def check_optional(name: str, value, label: str | None = None):
    return None if value is None else check(name, value, label)


def cli_type(name: str):
    """An argparse `type=` that parses and range-checks option `name` (argparse then exits 2 with usage)."""

    def parse(text: str):
        limit = LIMITS[name]
        try:
            value = int(text) if limit.whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {limit.describe()}, got '{text}'") from None
        try:
            return check(name, value)
        except VibeVoiceError:
            raise argparse.ArgumentTypeError(f"must be {limit.describe()}, got '{text}'") from None

    parse.__name__ = name  # argparse names the type in some messages
    return parse
