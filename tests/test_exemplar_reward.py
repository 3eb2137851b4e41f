"""Issue 34 item 4: a contrastive persona reward on exemplars of how each persona talks, kept
apart from what the probe's readers learn from (`readers.split_references`), with the real
MiniLM of the embedded judge."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.judges import EmbeddedJudge, ResponseItem
from mascot_dag.lib.judges.exemplars import consistency_table, persona_accuracies
from mascot_dag.lib.stage1 import readers

SHARE = 0.5


def _texts(split: dict[str, list[str]]) -> set[str]:
    return {t for ts in split.values() for t in ts}


@pytest.mark.parametrize("persona_set", ["support", "workplace"])
@pytest.mark.parametrize("share", [0.25, SHARE, 0.75])
def test_split_is_disjoint_complete_and_deterministic(persona_set, share):
    refs = readers.load_reference_utterances(persona_set)
    reward, kept = readers.split_references(refs, share)
    assert not _texts(reward) & _texts(kept)  # never a text on both sides, under any persona
    assert _texts(reward) | _texts(kept) == _texts(refs)
    for pid, texts in refs.items():
        # the readers keep exactly the persona's texts that no reward share holds
        assert kept[pid] == [t for t in texts if t not in _texts(reward)]
        assert len(reward[pid]) == round(share * len(set(texts)))
    # the same split on every call, and whatever the order of the file
    assert readers.split_references(refs, share) == (reward, kept)
    shuffled = {pid: list(reversed(ts)) for pid, ts in reversed(list(refs.items()))}
    again, _ = readers.split_references(shuffled, share)
    assert {p: set(ts) for p, ts in again.items()} == {p: set(ts) for p, ts in reward.items()}


def test_share_zero_is_todays_behaviour_and_bad_shares_fail():
    refs = readers.load_reference_utterances("support")
    reward, kept = readers.split_references(refs, 0.0)
    assert kept == refs and not _texts(reward)
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="reward_reference_share"):
            readers.split_references(refs, bad)
    # a text listed under two personas lands on one side only
    dup = {"a": ["same words here", "alpha one", "alpha two"],
           "b": ["same words here", "beta one", "beta two"]}
    r, k = readers.split_references(dup, SHARE)
    assert not _texts(r) & _texts(k)


def test_settings_need_a_reward_share_for_reference_exemplars():
    from mascot_dag.profiles import judge_panel, override_settings, settings_for

    study = settings_for("study")
    assert (study.persona_exemplars, study.reward_reference_share) == ("card", 0.0)
    with pytest.raises(ValueError, match="reward_reference_share > 0"):
        override_settings(study, ["persona_exemplars=references"])
    with pytest.raises(ValueError, match="persona_exemplars"):
        override_settings(study, ["persona_exemplars=cards", "reward_reference_share=0.5"])
    with pytest.raises(ValueError, match="0 < reward_reference_share < 1"):
        EmbeddedJudge(persona_exemplars="references")
    s = override_settings(study, ["persona_exemplars=references", "reward_reference_share=0.5"])
    emb = judge_panel("study", s).embedded
    assert (emb.persona_exemplars, emb.reward_reference_share) == ("references", SHARE)
    assert judge_panel("study").embedded.persona_exemplars == "card"  # without settings: as before
    # written exemplars are the reward's own texts: the readers keep every reference (share 0)
    s = override_settings(study, ["persona_exemplars=exemplars"])
    assert judge_panel("study", s).embedded.persona_exemplars == "exemplars"


@pytest.fixture(scope="module")
def support():
    return personas_of_set(load_personas(), "support")


def _consistency(judge, roster, pairs):
    """Consistency (1-5) of each (text, persona) with the text as its own context (on topic:
    gate 1, so the score is the persona margin less the card-copy penalty)."""
    items = [ResponseItem(context_text=t, persona=c, roster=roster, response=t, history=[])
             for t, c in pairs]
    return np.asarray([next(s.score for s in row if s.criterion == "consistency")
                       for row in judge.score_responses(items)])


def test_reference_exemplars_reward_how_a_persona_talks(support):
    card = EmbeddedJudge()
    refs = EmbeddedJudge(persona_exemplars="references", reward_reference_share=SHARE)
    reward, _ = readers.split_references(readers.load_reference_utterances("support"), SHARE)
    by_id = {c.persona_id: c for c in support}
    t0 = time.perf_counter()
    refs._prepare([], [], support)  # the exemplars' vectors, before reading the centroids
    wins, gains = [], []
    for a in support:
        # the most similar other persona of the roster, by the reference judge's centroids
        centroid = refs.persona(a).centroid
        b = max((c for c in support if c.persona_id != a.persona_id),
                key=lambda c: float(refs.persona(c).centroid @ centroid))
        texts = reward[a.persona_id]
        as_a = _consistency(refs, support, [(t, a) for t in texts])
        as_b = _consistency(refs, support, [(t, b) for t in texts])
        before = _consistency(card, support, [(t, a) for t in texts])
        wins.append(as_a > as_b)
        gains.append(as_a - before)
        print(f"\n{a.persona_id} vs closest {b.persona_id} (n={len(texts)}): consistency as A "
              f"{as_a.mean():.2f} vs as B {as_b.mean():.2f}, A wins {np.mean(as_a > as_b):.0%}; "
              f"as A under card exemplars {before.mean():.2f} ({np.mean(as_a - before):+.2f})")
        assert as_a.mean() > as_b.mean(), f"{a.persona_id}: its own reward share favours {b}"
        assert by_id[b.persona_id] is not a
    wins, gains = np.concatenate(wins), np.concatenate(gains)
    print(f"pooled: A over its closest rival on {wins.mean():.0%} of {len(wins)} reward-share "
          f"utterances; consistency vs card exemplars {gains.mean():+.3f} "
          f"({time.perf_counter() - t0:.1f}s)")
    assert wins.mean() >= 0.9
    assert gains.mean() > 0  # the reward share now counts as the persona's voice


def test_a_set_without_references_falls_back_to_the_card_with_a_warning(support):
    judge = EmbeddedJudge(persona_exemplars="references", reward_reference_share=SHARE)
    lone = [c.model_copy(update={"persona_set": "no_such_set"}) for c in support]
    text = "That sounds really hard, and I am here with you."
    with pytest.warns(UserWarning, match="no reference utterances for no_such_set"):
        fell = _consistency(judge, lone, [(text, lone[0])])
    assert "no_such_set" in judge.exemplars.notes
    assert fell[0] == _consistency(EmbeddedJudge(), lone, [(text, lone[0])])[0]  # = card judge
    item = ResponseItem(context_text=text, persona=lone[0], roster=lone, response=text,
                        history=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per set: no second warning
        why = next(s.rationale for s in judge.score_responses([item])[0]
                   if s.criterion == "consistency")
    assert "fallback" in why


def test_readers_fit_on_the_reader_share_only():
    refs = readers.load_reference_utterances("support")
    reward, kept = readers.split_references(refs, SHARE)
    t0 = time.perf_counter()
    panel = readers.fitted_panel("support", 0, SHARE)
    for reader, acc in panel:
        seen = set(reader.trained_on)
        assert seen == _texts(kept) and not seen & _texts(reward), reader.name
        print(f"\n{reader.name}: fitted on {len(seen)} reader-share utterances, 5-fold accuracy "
              f"{acc:.1%}")
    print(f"({time.perf_counter() - t0:.1f}s)")
    # the panel resource refuses a judge that learns from another share than the readers leave
    from mascot_dag.resources.judge import EmbeddedJudgeResource, JudgePanelResource

    judges = JudgePanelResource(embedded=EmbeddedJudgeResource(
        persona_exemplars="references", reward_reference_share=SHARE))
    with pytest.raises(ValueError, match="overlap"):
        judges.probe_panel("support", [], 0, 0.0)
    assert judges.probe_panel("support", [], 0, SHARE) == list(panel)


def test_an_exemplar_that_is_a_reference_is_refused(tmp_path, monkeypatch):
    """Written exemplars never share a text with the probe's references: one that does is an
    error naming both files and the persona, before any score."""
    import shutil

    from mascot_dag.lib.data import personas as packaged

    folder = tmp_path / "personas"
    (folder / "probe").mkdir(parents=True)
    (folder / "exemplars").mkdir()
    root = readers.PROBE_DIR.parent
    shutil.copy(root / "support.yaml", folder / "support.yaml")
    shutil.copy(readers.PROBE_DIR / "support.yaml", folder / "probe" / "support.yaml")
    refs = readers.load_reference_utterances("support")
    leaked = refs["catalyst"][3]
    (folder / "exemplars" / "support.yaml").write_text(
        "set: support\nutterances:\n  anchor:\n    - \"I am right here with you.\"\n"
        f"  catalyst:\n    - \"{leaked}\"\n", encoding="utf-8")
    monkeypatch.setenv("MASCOT_PERSONAS_DIR", str(folder))
    cards = personas_of_set(packaged.load_personas(str(folder)), "support")
    judge = EmbeddedJudge(persona_exemplars="exemplars")
    with pytest.raises(ValueError, match=r"exemplars/support\.yaml: utterances\.catalyst .*"
                                         r"probe/support\.yaml.*never share"):
        judge.reward_share(cards[0])


def test_written_exemplars_name_held_out_references(support):
    """The utterances written for the reward (personas/exemplars/support.yaml) share no text
    with the probe's references, and with them the judge's consistency names the persona of
    references it never saw more often than with the card alone (pairwise accuracy over the
    other personas; on all 160 support references, scripts/exemplar_reward_accuracy.py --kind
    exemplars measured 0.860 -> 0.935, +0.075 [+0.050, +0.102])."""
    judge = EmbeddedJudge(persona_exemplars="exemplars")
    refs = readers.load_reference_utterances("support")
    written = {c.persona_id: judge.reward_share(c) for c in support}
    assert all(len(ts) >= 30 for ts in written.values()), {p: len(t) for p, t in written.items()}
    assert not _texts(written) & _texts(refs)
    # the two personas the card judge confused most, 12 held-out references each
    ids = [c.persona_id for c in support]
    held = [(t, pid) for pid in ("catalyst", "beacon") for t in refs[pid][:12]]
    truth = np.asarray([ids.index(pid) for _, pid in held])
    accuracy = {name: float(persona_accuracies(
                    consistency_table(j, support, [t for t, _ in held]), truth)[0].mean())
                for name, j in (("card", EmbeddedJudge()), ("exemplars", judge))}
    print(f"\npairwise accuracy on {len(held)} held-out references: {accuracy}")
    assert accuracy["exemplars"] > accuracy["card"] + 0.05, accuracy
