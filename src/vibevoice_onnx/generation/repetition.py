"""The repetition guard of greedy transcription (ASR and ASR-Streaming): a decoding loop found in the token ids
as they are picked, cut back to its first occurrence, and decoding resumed with the token that restarted the
loop banned at that place. Torch-free.

What counts as a loop: the last tokens are periodic, with a period `p` of at most MAX_PERIOD tokens repeated
at least MIN_REPEATS times in a row, spanning at least MIN_SPAN tokens (so a short period must repeat more:
one token 48 times, a two-token "no," 24 times). Speech repeats itself too, and these thresholds leave it
alone: "no, no, no, no" (period 2, four times: 8 tokens), a chorus line sung four times (period ~10, four
times), a list or counting (not periodic: each item differs). Upstream's vLLM plugin (its auto-recover client)
looks for a text pattern of 10 or more characters repeated 10 times in the last 400 characters; a pattern of
10 to 40 characters is 3 to 10 tokens, so its loops are ours with a few more repeats, and ours also catches
periods of up to MAX_PERIOD tokens (a whole sentence looping), repeated MIN_REPEATS times, which upstream's
window is too short to see. A loop whose tokens change each time (segments repeated with new timestamps) is
not periodic, so not caught.

How it recovers (upstream retries the request from its last complete segment with sampling at temperature
0.2, 0.3, 0.4, top-p 0.95, up to three times): the generated tokens are cut back to the end of the loop's first
occurrence (one copy kept: the text it repeats was heard once at least), the KV cache rewound to there, and
the token that would start the second copy banned at that position; greedy decoding then goes on. No
sampling: the result is a function of the audio and the seed alone, like the rest of the transcription, and
the decoding is the unguarded one wherever no loop is found. A loop found again (at the same place, with the
bans growing, or later) is recovered again; when MAX_RECOVERIES loops in a row were cut within NEAR tokens of
the one before (the model keeps falling back into loops there), the next one is cut at its first occurrence
and decoding stops (upstream gives up after three retries a request). Loops far apart in a long transcript
are each recovered, so the work stays within a few hundred tokens a loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

MAX_PERIOD = 64  # tokens in one repetition of a loop at most (about a long sentence)
MIN_REPEATS = 8  # times the period must repeat in a row (upstream's client: 10 repeats of a short pattern)
MIN_SPAN = 48  # tokens the repeats must cover in all, so that a period of one or two tokens repeats 48 or 24 times
MAX_RECOVERIES = 3  # loops recovered from in a row, each cut near the last, before the guard stops the decoding
NEAR = 256  # tokens between two cuts that make them one place of the text (a loop the model keeps falling back into)


@dataclass(frozen=True)
class Thresholds:
    max_period: int = MAX_PERIOD
    min_repeats: int = MIN_REPEATS
    min_span: int = MIN_SPAN
    max_recoveries: int = MAX_RECOVERIES
    near: int = NEAR

    def needed(self, period: int) -> int:
        """How many tokens of period `period` make a loop: whole repeats, at least min_repeats and min_span."""
        return period * max(self.min_repeats, -(-self.min_span // period))


@dataclass(frozen=True)
class Loop:
    start: int  # index of the loop's first token in the tokens searched
    period: int
    end: int  # index after the last token searched (the loop's end)
    chunk: int | None = None  # ASR-Streaming: the chunk it was found in (a whole session's report)

    @property
    def keep(self) -> int:
        """The tokens kept: everything up to the end of the loop's first occurrence."""
        return self.start + self.period

    @property
    def repeats(self) -> float:
        return (self.end - self.start) / self.period

    def as_dict(self) -> dict:
        chunk = {} if self.chunk is None else {"chunk": self.chunk}
        return {**chunk, "at_token": self.keep, "period": self.period, "repeats": round(self.repeats, 2),
                "tokens_cut": self.end - self.keep}


def find_loop(tokens: list[int], thresholds: Thresholds = Thresholds()) -> Loop | None:
    """The loop `tokens` end in, if they end in one (see the module docstring), with its smallest period; its
    start is where the periodic run begins (walked back as far as it goes)."""
    length = len(tokens)
    last = tokens[-1] if length else None
    for period in range(1, min(thresholds.max_period, length // 2) + 1):
        need = thresholds.needed(period)
        if need > length or tokens[-1 - period] != last:
            continue
        tail = tokens[length - need:]
        if tail[period:] != tail[:-period]:
            continue
        start = length - need
        while start > 0 and tokens[start - 1] == tokens[start - 1 + period]:
            start -= 1
        return Loop(start, period, length)
    return None


@dataclass
class Repetition:
    """What the guard did in one transcription (one chunk): the loops it found, each as the tokens were then
    (at_token: how many tokens were kept, the loop's first occurrence included), and whether decoding then
    ended on its own (`recovered`) or was stopped by the guard after MAX_RECOVERIES. `guard`: whether the guard
    was on (off: nothing was looked for)."""

    loops: list[Loop] = field(default_factory=list)
    stopped: bool = False
    guard: bool = False

    @property
    def detected(self) -> bool:
        return bool(self.loops)

    @property
    def recovered(self) -> bool:
        return self.detected and not self.stopped

    def as_dict(self) -> dict:
        return {"guard": self.guard, "detected": self.detected, "recovered": self.recovered,
                "loops": [loop.as_dict() for loop in self.loops]}

    @classmethod
    def of_chunks(cls, reports: list["Repetition"], guard: bool) -> "Repetition":
        """One report of a session's chunks (each loop with its chunk's index); stopped if any chunk's was."""
        loops = [replace(loop, chunk=index) for index, report in enumerate(reports) for loop in report.loops]
        return cls(loops, any(report.stopped for report in reports), guard)

    def describe(self) -> str | None:
        """A sentence for a warning, None when no loop was found."""
        if not self.loops:
            return None
        found = ", ".join(f"{loop.period}-token period x{loop.repeats:g} at token {loop.keep}"
                          + ("" if loop.chunk is None else f" of chunk {loop.chunk}") for loop in self.loops)
        outcome = ("decoding stopped there: the output is cut after the loop's first occurrence" if self.stopped else
                   "recovered: cut back to its first occurrence, decoding resumed with the looping token banned")
        return f"repetition loop{'s' * (len(self.loops) > 1)} detected ({found}); {outcome}"


class RepetitionGuard:
    """The guard of one decoding loop: `check(tokens)` after each pick gives the Loop to recover from (or None),
    `banned(index)` the tokens banned as pick `index`."""

    def __init__(self, thresholds: Thresholds = Thresholds()):
        self.thresholds, self.report = thresholds, Repetition(guard=True)
        self.bans: dict[int, set[int]] = {}
        self.in_a_row = 0  # loops recovered from, each cut within `near` tokens of the one before

    def check(self, tokens: list[int]) -> Loop | None:
        loop = find_loop(tokens, self.thresholds)
        if loop is None:
            return None
        last = self.report.loops[-1].keep if self.report.loops else None
        self.in_a_row = self.in_a_row + 1 if last is not None and abs(loop.keep - last) <= self.thresholds.near else 1
        self.report.loops.append(loop)
        if self.in_a_row > self.thresholds.max_recoveries:
            self.report.stopped = True
        else:  # bans past the cut were made in a context that is gone
            keep = loop.keep
            self.bans = {index: banned for index, banned in self.bans.items() if index <= keep}
            self.bans.setdefault(keep, set()).add(tokens[keep])
        return loop

    @property
    def stopped(self) -> bool:
        return self.report.stopped

    def banned(self, index: int) -> set[int]:
        """The tokens banned as pick `index` (counted from 0)."""
        return self.bans.get(index, set())
