"""A three-way picker that shares nothing with the embedded judge (the signal that trains MASCOT).

The embedded judge scores persona fidelity by MiniLM similarity to the persona cards, relevance
by MiniLM similarity to the context, and redundancy against earlier turns; preference pairs and
the director's reward come from it. Letting that same judge also pick the best of three
dialogues would grade MASCOT on the signal it was optimised for. This picker instead ranks each
option by the mean of three parts, each 0-1, higher better, none of them from MiniLM or the cards:

- identifiability: share of agent turns whose speaker the probe's reference classifier
  (`lib.stage1.readers.LexicalReader`: TF-IDF + logistic regression on utterances written for the
  probe, no 4-gram shared with the cards) recovers: distinct, recognisable voices;
- distinct-2 over agent turns: specific rather than generic wording;
- 1 - lexical redundancy against earlier turns (`lib.metrics.redundancy_lexical`): adds
  something instead of echoing (social sycophancy).

Parts undefined for an option (e.g. no earlier turn) are left out of its mean; ties go to the
lower index; an option without agent turns cannot win; None when no option can be scored.
"""

from __future__ import annotations

from mascot_dag.lib.evaluation.metrics import distinct_n, redundancy_lexical

USER = "user"


class MetricPicker:
    name = "metric"

    def __init__(self, persona_sets: tuple[str, ...] = ("support", "workplace"), seed: int = 0):
        self.persona_sets = persona_sets
        self.seed = seed
        self._classifiers: dict[str, object] = {}

    def _classifier(self, speakers: set[str]):
        """The reference classifier of the persona set that knows most of these speakers."""
        from mascot_dag.lib.stage1.readers import LexicalReader, load_reference_utterances

        for s in self.persona_sets:
            if s not in self._classifiers:
                self._classifiers[s] = LexicalReader(load_reference_utterances(s), seed=self.seed)
        clf = max((self._classifiers[s] for s in self.persona_sets),
                  key=lambda c: len(speakers & set(c.labels)))
        return clf if speakers & set(clf.labels) else None

    def option_score(self, option: list[dict]) -> float | None:
        turns = [{"speaker": str(t.get("speaker", "")), "text": str(t.get("text", "")),
                  "role": "user" if t.get("speaker") == USER else "agent"} for t in option]
        agents = [t for t in turns if t["role"] == "agent"]
        if not agents:
            return None
        parts = []
        clf = self._classifier({t["speaker"] for t in agents})
        if clf is not None:
            pred = clf.predict([t["text"] for t in agents])
            parts.append(sum(p == t["speaker"] for p, t in zip(pred, agents, strict=True))
                         / len(agents))
        d2, red = distinct_n(turns, 2), redundancy_lexical(turns)
        if d2 is not None:
            parts.append(d2)
        if red is not None:
            parts.append(1.0 - red)
        return sum(parts) / len(parts) if parts else None

    def pick_best(self, context_text: str, options: list[list[dict]]) -> int | None:
        best, best_score = None, None
        for i, o in enumerate(options):
            s = self.option_score(o)
            if s is not None and (best_score is None or s > best_score):
                best, best_score = i, s
        return best
