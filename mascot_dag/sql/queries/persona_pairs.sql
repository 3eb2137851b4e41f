-- Preference pairs per persona: how many, and how far apart chosen and rejected were scored.
SELECT
    pp.persona_id,
    p.name AS persona_name,
    count(*) AS pairs,
    count(DISTINCT pp.context_id) AS contexts,
    round(avg(pp.margin), 3) AS mean_margin,
    min(pp.margin) AS min_margin,
    max(pp.margin) AS max_margin
FROM preference_pairs AS pp
LEFT JOIN personas AS p USING (persona_id)
GROUP BY pp.persona_id, p.name
ORDER BY pp.persona_id;
