-- The persona probe per persona and arm: identifiability by the independent classifier, judge
-- consistency and relevance (1-5), copied card phrases; paired CIs are in the asset's metadata.
SELECT
    persona_id,
    arm,
    any_value(model_version) AS model_version,
    count(*) AS n,
    round(avg(identifiable), 3) AS identifiable,
    round(avg(consistency), 3) AS consistency,
    round(avg(relevance), 3) AS relevance,
    round(avg(copied), 3) AS copied
FROM persona_probe
GROUP BY persona_id, arm
ORDER BY persona_id, arm;
