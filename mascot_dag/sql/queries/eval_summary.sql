-- Evaluation scores per method, level and criterion: mean over dialogues (and judges) and n.
SELECT
    method,
    level,
    criterion,
    round(avg(value), 3) AS mean_value,
    count(value) AS n,
    any_value(higher_is_better) AS higher_is_better
FROM eval_scores
GROUP BY method, level, criterion
ORDER BY level, criterion, method;
