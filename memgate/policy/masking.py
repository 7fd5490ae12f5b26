"""Deterministic masking of personal data (SPEC §3.2).

Detectors run in a fixed order and the whole pass repeats until nothing changes, so the output
is a fixpoint: masking masked text changes nothing, and no detector matches what is left.

Every detector is linear in the length of its input (SPEC §3.2, #28 finding 6): no pattern can
begin a match inside a run it would scan again from the run's start (a start is where the run
starts, `(?<!…)`), runs are taken possessively (`++`, `*+`: what failed once is not retried
shorter), and every other repetition is bounded. A masking of n characters does O(n) work;
`tests/test_masking.py` measures it on adversarial inputs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Check = Callable[[str], bool]


_NON_DIGIT = re.compile(r"\D")
_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # a Luhn digit doubled, its digits summed


def _digits(text: str) -> str:
    return _NON_DIGIT.sub("", text)


def luhn_valid(number: str) -> bool:
    digits = _digits(number)
    if not digits.isascii():  # other scripts' digits, as their values
        digits = "".join(str(int(d)) for d in digits)
    total = sum(map(int, digits[-1::-2])) + sum(_DOUBLED[int(d)] for d in digits[-2::-2])
    return total % 10 == 0


def israeli_id_valid(number: str) -> bool:
    digits = _digits(number)
    if len(digits) != 9:
        return False
    total = 0
    for i, ch in enumerate(digits):
        product = int(ch) * (1 + i % 2)
        total += product - 9 if product > 9 else product
    return total % 10 == 0


def iban_valid(candidate: str) -> bool:
    compact = re.sub(r"\s", "", candidate).upper()
    if not 15 <= len(compact) <= 34:
        return False
    rotated = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in rotated)) % 97 == 1


@dataclass(frozen=True)
class Detector:
    """`pattern` finds candidates; `check` (if any) confirms one. `resume`, when set, is tried
    right where the previous match ended: `pattern` may only start a match at the start of a
    run (so that it never rescans one), but a run the previous match ended inside may start
    there too, as it would for a pattern without that guard."""

    kind: str
    pattern: re.Pattern[str]
    check: Check | None = None
    resume: re.Pattern[str] | None = None

    @property
    def placeholder(self) -> str:
        return f"[{self.kind}]"


_SEP = r"[ \-.]"
_LOCAL = r"[\w.+%-]"
_EMAIL = rf"{_LOCAL}++@[\w-]++(?:\.[\w-]++)++"
DETECTORS: tuple[Detector, ...] = (
    Detector("EMAIL", re.compile(rf"(?<!{_LOCAL}){_EMAIL}"), resume=re.compile(_EMAIL)),
    Detector(
        "BANK_ACCOUNT",
        re.compile(r"\b[A-Za-z]{2}\d{2}(?:\s?[A-Za-z0-9]){11,30}\b"),
        iban_valid,
    ),
    Detector("CARD", re.compile(r"(?<!\d)\d(?:[ \-]?\d){12,18}(?!\d)"), luhn_valid),
    Detector(
        "PHONE",
        re.compile(
            r"(?:\+\d{1,3}[ \-.]?(?:\(\d{1,4}\)[ \-.]?)?\d{1,4}(?:[ \-.]?\d{2,4}){1,4}(?!\d))"
            rf"|(?:(?<!\d)\(?\d{{2,4}}\)?{_SEP}\d{{3,4}}{_SEP}\d{{3,4}}(?!\d))"
        ),
    ),
    Detector("IL_ID", re.compile(r"(?<!\d)\d{9}(?!\d)"), israeli_id_valid),
    Detector(
        "BANK_ACCOUNT",
        re.compile(
            r"(?i)(?<![^\W\d_])(?:account|acct|a/c)\b(?:\s*+(?:no\.?|number|#))?+\s*+:?+\s*+"
            r"(?P<pii>\d[\d \-]{4,}\d)"
        ),
    ),
    Detector("NUMBER", re.compile(r"\d{10,}")),
)


@dataclass(frozen=True)
class Masked:
    text: str
    counts: dict[str, int]

    @property
    def only_placeholders(self) -> bool:
        rest = self.text
        for detector in DETECTORS:
            rest = rest.replace(detector.placeholder, "")
        return not rest.strip()


def _substitute(detector: Detector, text: str, counts: Counter[str]) -> str:
    """`pattern.sub` with the detector's check, and its `resume` at each match's end."""
    pieces: list[str] = []
    at = 0
    while True:
        match = detector.resume.match(text, at) if at and detector.resume else None
        match = match or detector.pattern.search(text, at)
        if match is None:
            break
        whole = match.group(0)
        pieces.append(text[at:match.start()])
        at = match.end()
        if detector.check is not None and not detector.check(whole):
            pieces.append(whole)
            continue
        counts[detector.kind] += 1
        start = match.start("pii") - match.start() if "pii" in match.re.groupindex else 0
        pieces.append(whole[:start] + detector.placeholder)
    if not pieces:
        return text
    pieces.append(text[at:])
    return "".join(pieces)


# A UUID (RFC 9562: its version and variant nibbles) is random, never a person's: the digit runs
# in one (~6% of version-4 UUIDs) are not read as phone or other numbers. A langmem tool's key
# was refused as personal data otherwise.
_UUID = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-"
                   r"[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}(?![0-9A-Za-z])")


def _mask_once(text: str, counts: Counter[str]) -> str:
    pieces = _UUID.split(text)
    uuids = _UUID.findall(text)
    masked = []
    for piece in pieces:
        for detector in DETECTORS:
            piece = _substitute(detector, piece, counts)
        masked.append(piece)
    return "".join(m for pair in zip(masked, [*uuids, ""], strict=True) for m in pair)


# Every detector but EMAIL needs a digit, and EMAIL an `@`: a text with neither has nothing to
# mask, and is passed by one scan instead of every detector's (a bulk import's 1,000 texts).
_MAYBE_PERSONAL = re.compile(r"[\d@]")


def mask(text: str) -> Masked:
    """Replace every piece of personal data with a typed placeholder, deterministically."""
    if _MAYBE_PERSONAL.search(text) is None:
        return Masked(text=text, counts={})
    counts: Counter[str] = Counter()
    while True:
        masked = _mask_once(text, counts)
        if masked == text:
            return Masked(text=masked, counts=dict(sorted(counts.items())))
        text = masked


_APART = "\x00"  # no detector matches across it or looks past it: a string's edge to each


def mask_many(texts: Sequence[str]) -> list[str]:
    """Each text as `mask` gives it, masked in one pass over them all: a JSON body of many
    short strings costs one masking of its length, not one per string."""
    if any(_APART in text for text in texts):
        return [mask(text).text for text in texts]
    return mask(_APART.join(texts)).text.split(_APART) if texts else []


def contains_personal_data(text: str) -> bool:
    return bool(mask(text).counts)
