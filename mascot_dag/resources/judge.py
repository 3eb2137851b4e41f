"""Judge resources: the embedded feature judge and the LLM rubric judge, built once per resource.

Assets ask for a judge resource and call `.judge()` to get a `lib.judges` judge; evaluation can
hold both side by side to report how well they agree.
"""

# No `from __future__ import annotations`: dagster must see ResourceDependency[...] unquoted.
import functools
import threading
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from mascot_dag.lib.judges import EmbeddedJudge, LLMJudge
from mascot_dag.resources.llm import ChatModelResource


class EmbeddedJudgeResource(dg.ConfigurableResource):
    """Deterministic CPU judge (MiniLM embeddings, VADER/NRC lexicons, format checks)."""

    device: str = Field(
        default="cpu", description="Where MiniLM runs; CPU keeps scores deterministic."
    )
    persona_exemplars: str = Field(
        default="card", description="What persona centroids average: 'card', 'references' or "
        "'exemplars' (LineageSettings.persona_exemplars; profiles.judge_panel copies it from the "
        "settings).")
    reward_reference_share: float = Field(
        default=0.0, description="The reference utterances' reward share "
        "(LineageSettings.reward_reference_share, copied the same way).")

    _judge: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def judge(self) -> EmbeddedJudge:
        with self._lock:
            if self._judge is None:
                self._judge = _shared_embedded(self.device, self.persona_exemplars,
                                               self.reward_reference_share)
            return self._judge


@functools.lru_cache(maxsize=4)
def _shared_embedded(device: str, persona_exemplars: str = "card",
                     reward_reference_share: float = 0.0) -> EmbeddedJudge:
    """One embedded judge per process and configuration (it is deterministic and stateless
    apart from caches)."""
    return EmbeddedJudge(device=device, persona_exemplars=persona_exemplars,
                         reward_reference_share=reward_reference_share)


class LLMJudgeResource(dg.ConfigurableResource):
    """Rubric judge through a chat model resource (strict JSON, retried, failures recorded)."""

    chat: dg.ResourceDependency[ChatModelResource]
    name: str = Field(default="llm", description="Judge name stored with every score.")
    max_retries: int = Field(default=1, description="Repair attempts after an invalid reply.")
    max_new_tokens: int = Field(default=400, description="Token budget of one judge reply (5 "
                                "criteria with 160-character rationales need ~300).")
    structured_output: bool = Field(
        default=True,
        description="Send the reply's JSON schema as response_format (structured outputs), so "
        "the server can only return valid JSON. Turn off for a server without structured "
        "outputs (it would answer HTTP 400); replies are then parsed leniently and repaired.",
    )
    rationale_max_chars: int = Field(
        default=160,
        description="maxLength of each rationale in the structured reply's schema (a shorter "
        "one makes replies shorter and judging faster).",
    )

    _judge: Any = PrivateAttr(default=None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def judge(self) -> LLMJudge:
        with self._lock:
            if self._judge is None:
                self._judge = LLMJudge(
                    self.chat.generate,
                    name=self.name,
                    max_retries=self.max_retries,
                    max_new_tokens=self.max_new_tokens,
                    structured=self.structured_output,
                    rationale_chars=self.rationale_max_chars,
                )
            return self._judge


class JudgePanelResource(dg.ConfigurableResource):
    """The profile's judges, side by side: every judge-consuming asset scores with each of them
    and stores one row per judge; `training_judge` and `three_way_judge` say which signal trains
    and which picks in the three-way comparisons (lib/judges/panel.py, metric_picker.py).

    Dagster nests resources only as direct (or Optional) fields, not inside a list, so the panel
    has one optional slot per judge kind; `judges()` is the list, in slot order."""

    embedded: EmbeddedJudgeResource | None = Field(
        default=None, description="The deterministic embedded judge; None leaves it out."
    )
    llm: LLMJudgeResource | None = Field(
        default=None, description="An LLM rubric judge (OpenAI-compatible endpoint or local)."
    )
    training_judge: str = Field(
        default="mean",
        description="The one score training uses (preference pairs, warm start, director "
        "reward, persona probe): 'mean' = per criterion the mean over judges of their ok "
        "scores, or a judge name (e.g. 'embedded') so that only it trains.",
    )
    three_way_judge: str = Field(
        default="metric",
        description="Who picks the best of three dialogues: a judge name of the panel, 'mean' "
        "(the panel's majority), or 'metric' (reference-classifier identifiability, distinct-2, "
        "low redundancy: shares nothing with the embedded judge that trains MASCOT).",
    )

    _judge_readers: Any = PrivateAttr(default_factory=dict)

    def judges(self) -> list:
        """The lib judges of the panel (built once each), names unique."""
        from mascot_dag.lib.judges.panel import check_unique

        out = [r.judge() for r in (self.embedded, self.llm) if r is not None]
        if not out:
            raise ValueError("JudgePanelResource has no judge: set `embedded` and/or `llm`")
        check_unique(out)
        return out

    def training(self):
        """The judge whose scores train (a MeanJudge over the panel for 'mean')."""
        from mascot_dag.lib.judges.panel import training_judge

        return training_judge(self.judges(), self.training_judge)

    def probe_panel(self, persona_set: str, roster: list, seed: int = 0,
                    reference_share: float = 0.0) -> list:
        """The persona probe's readers with their accuracies [(reader, accuracy)]: the fitted
        lexical and semantic readers, and with an LLM judge in the panel the judge reader
        (lib/stage1/readers.py). The judge reader's accuracy costs one request per reference
        utterance, so it is measured once per resource and set. The readers fit and validate on
        the references' READER share (`reference_share` = reward_reference_share); an embedded
        judge learning from another reward share is an error: the shares would overlap."""
        from mascot_dag.lib.stage1.readers import fitted_panel, judge_panel_member

        emb = self.embedded
        if (emb is not None and emb.persona_exemplars == "references"
                and emb.reward_reference_share != reference_share):
            raise ValueError(
                f"the embedded judge learns from a reward share of {emb.reward_reference_share} "
                f"of the reference utterances, the probe's readers were asked to leave out "
                f"{reference_share}: the two would overlap (set reward_reference_share once, in "
                "the settings)")
        panel = list(fitted_panel(persona_set, seed, reference_share))
        if self.llm is not None:
            key = (persona_set, tuple(c.persona_id for c in roster), reference_share)
            if key not in self._judge_readers:
                descriptions = {c.persona_id: f"{c.name}, {c.role}. {c.description}"
                                for c in roster}
                self._judge_readers[key] = judge_panel_member(
                    self.llm.chat.generate, descriptions, persona_set, reference_share)
            panel.append(self._judge_readers[key])
        return panel

    def picker(self):
        """The three-way picker: `.pick_best(context_text, options)` and `.name`."""
        from mascot_dag.lib.judges.metric_picker import MetricPicker
        from mascot_dag.lib.judges.panel import MEAN, MeanJudge

        if self.three_way_judge == MetricPicker.name:
            return _shared_picker()
        judges = self.judges()
        if self.three_way_judge == MEAN:
            return MeanJudge(judges)
        for j in judges:
            if j.name == self.three_way_judge:
                return j
        raise ValueError(f"three_way_judge {self.three_way_judge!r} is not in the panel "
                         f"{[j.name for j in judges]}; use one of them, 'mean' or 'metric'")


@functools.lru_cache(maxsize=1)
def _shared_picker():
    from mascot_dag.lib.judges.metric_picker import MetricPicker

    return MetricPicker()
