-- Judge scores per persona and criterion (successful judgments only; failures have no score).
SELECT
    j.persona_id,
    p.name AS persona_name,
    j.criterion,
    round(avg(j.score), 3) AS mean_score,
    min(j.score) AS min_score,
    max(j.score) AS max_score,
    count(*) AS n
FROM judgments AS j
LEFT JOIN personas AS p USING (persona_id)
WHERE j.status = 'ok' AND j.score IS NOT NULL
GROUP BY j.persona_id, p.name, j.criterion
ORDER BY j.persona_id, j.criterion;
