-- The persona probe per persona, arm, format and reader: identifiability by each reader of the
-- panel (with the reader's accuracy on held-out reference utterances), judge consistency and
-- relevance (1-5), copied card phrases; paired CIs and the verdict are in `mascot probe`.
SELECT
    p.persona_id,
    p.arm,
    p.format,
    r.reader,
    any_value(p.model_version) AS model_version,
    count(*) AS n,
    round(avg(r.identifiable), 3) AS identifiable,
    round(any_value(a.accuracy), 3) AS reader_accuracy,
    round(avg(p.consistency), 3) AS consistency,
    round(avg(p.relevance), 3) AS relevance,
    round(avg(p.copied), 3) AS copied
FROM persona_probe p
JOIN probe_readings r USING (persona_id, context_id, seed, arm, format)
LEFT JOIN personas c ON c.persona_id = p.persona_id
LEFT JOIN probe_readers a ON a.persona_set = c.persona_set AND a.reader = r.reader
GROUP BY p.persona_id, p.arm, p.format, r.reader
ORDER BY p.persona_id, p.arm, p.format, r.reader;
