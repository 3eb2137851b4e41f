"""How well the embedded judge's consistency names the persona of HELD-OUT reference utterances,
with persona centroids of the card ("card") and of the card's examples + the references' reward
share ("references"): the AI feedback signal of issue 34 item 4, measured without training.

Stand-in replies: the READER share of each persona's references (`split_references`), texts the
"references" judge never learned from. Each is judged as every persona of its roster, with the
utterance itself as the context (relevance gate 1: the consistency criterion is then the
persona margin less the card-copy penalty). Pairwise accuracy of an utterance: the share of the
other personas B whose consistency is below the true persona's (a tie counts half); top-1: the
true persona has the highest consistency. The difference is paired by utterance, with a 95%
bootstrap CI (10,000 resamples of utterances).

`--kind exemplars` compares the card with the utterances written for the reward
(personas/exemplars/<set>.yaml): then every reference utterance is held out (share 0).

    .venv/bin/python scripts/exemplar_reward_accuracy.py [--share 0.5] [--sets support workplace]
    .venv/bin/python scripts/exemplar_reward_accuracy.py --kind exemplars --sets support
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mascot_dag.lib.data.personas import load_personas, personas_of_set
from mascot_dag.lib.judges import EmbeddedJudge
from mascot_dag.lib.judges.exemplars import consistency_table, persona_accuracies
from mascot_dag.lib.stage1.readers import load_reference_utterances, split_references


def bootstrap(diff: np.ndarray, n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (n, len(diff)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--sets", nargs="+", default=["support", "workplace"])
    ap.add_argument("--kind", choices=["references", "exemplars"], default="references")
    args = ap.parse_args()
    if args.kind == "exemplars":
        args.share = 0.0  # the written exemplars are the reward's: every reference is held out
    card_judge = EmbeddedJudge()
    ref_judge = EmbeddedJudge(persona_exemplars=args.kind, reward_reference_share=args.share)
    print(f"| set | share | n (held-out utterances) | metric | card | {args.kind} | "
          "difference [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    for pset in args.sets:
        t0 = time.perf_counter()
        roster = personas_of_set(load_personas(), pset)
        ids = [c.persona_id for c in roster]
        reward, held = split_references(load_reference_utterances(pset), args.share)
        if args.kind == "exemplars":
            reward = {c.persona_id: ref_judge.reward_share(c) for c in roster}
        utts = [u for pid in ids for u in held[pid]]
        truth = np.asarray([ids.index(pid) for pid in ids for _ in held[pid]])
        assert not set(utts) & {t for ts in reward.values() for t in ts}
        res = {}
        for name, judge in (("card", card_judge), (args.kind, ref_judge)):
            res[name] = persona_accuracies(consistency_table(judge, roster, utts), truth)
        for m, label in ((0, "pairwise accuracy"), (1, "top-1 accuracy")):
            a, b = res["card"][m], res[args.kind][m]
            lo, hi = bootstrap(b - a)
            print(f"| {pset} | {args.share} | {len(utts)} | {label} | {a.mean():.3f} | "
                  f"{b.mean():.3f} | {b.mean() - a.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] |")
        per = {pid: (res["card"][0][truth == i].mean(), res[args.kind][0][truth == i].mean())
               for i, pid in enumerate(ids)}
        print(f"<!-- {pset} per persona pairwise card->{args.kind}: "
              + ", ".join(f"{p} {c:.2f}->{r:.2f}" for p, (c, r) in per.items())
              + f"; {time.perf_counter() - t0:.0f}s -->")


if __name__ == "__main__":
    main()
