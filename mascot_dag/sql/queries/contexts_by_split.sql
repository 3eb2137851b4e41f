-- How the contexts divide: source, domain, valence (ED only) and train/eval split.
SELECT source, domain, valence, split, count(*) AS contexts
FROM contexts
GROUP BY source, domain, valence, split
ORDER BY source, domain, valence NULLS LAST, split;
