"""Valence of the 32 EmpatheticDialogues emotion labels: positive, negative or neutral.

MASCOT splits ED contexts by valence, but the paper does not publish its mapping, so this one is
OUR decision. It starts from the only public grouping we found, HypEmo's `data/ED/label_tree.tsv`
(14 positive, 17 negative, 1 ambiguous: surprised), and carves out a neutral bucket of five labels
whose conversations are, in the data, as often mixed or matter-of-fact as clearly good or bad:

- surprised: HypEmo itself leaves it ambiguous; ED surprises are pleasant and unpleasant alike.
- anticipating, prepared: forward-looking states about an upcoming event (an exam, a trip, a
  move) where the speaker mostly reports readiness, not a feeling with a sign.
- nostalgic, sentimental: bittersweet memories. HypEmo puts nostalgic under negative and
  sentimental under positive, which is itself evidence that neither sign fits well.

Every other label keeps HypEmo's sign: 11 positive, 16 negative, 5 neutral (32 in all). The
neutral bucket is about 15% of ED conversations, enough for the demo and evaluation to show all
three valences.
"""

from __future__ import annotations

POSITIVE: frozenset[str] = frozenset(
    {
        "caring", "confident", "content", "excited", "faithful", "grateful", "hopeful",
        "impressed", "joyful", "proud", "trusting",
    }
)  # fmt: skip
NEGATIVE: frozenset[str] = frozenset(
    {
        "afraid", "angry", "annoyed", "anxious", "apprehensive", "ashamed", "devastated",
        "disappointed", "disgusted", "embarrassed", "furious", "guilty", "jealous", "lonely",
        "sad", "terrified",
    }
)  # fmt: skip
NEUTRAL: frozenset[str] = frozenset(
    {"anticipating", "nostalgic", "prepared", "sentimental", "surprised"}
)

VALENCE: dict[str, str] = {
    **{e: "positive" for e in POSITIVE},
    **{e: "negative" for e in NEGATIVE},
    **{e: "neutral" for e in NEUTRAL},
}
EMOTIONS: tuple[str, ...] = tuple(sorted(VALENCE))
VALENCES: tuple[str, ...] = ("positive", "negative", "neutral")


class UnknownEmotionError(ValueError):
    pass


def valence_of(emotion: str) -> str:
    """Return "positive", "negative" or "neutral" for one of the 32 ED labels (any case)."""
    key = emotion.strip().lower()
    if key not in VALENCE:
        raise UnknownEmotionError(
            f"unknown emotion {emotion!r}: expected one of the 32 EmpatheticDialogues labels "
            f"({', '.join(EMOTIONS)})"
        )
    return VALENCE[key]
