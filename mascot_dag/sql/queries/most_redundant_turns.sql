-- Agent turns most similar to an earlier turn of the same dialogue (social sycophancy: repeating
-- instead of adding something). Similarity = Jaccard overlap of the two turns' lower-cased word
-- sets; each turn is paired with its most similar earlier turn. Top 20.
WITH words AS (
    SELECT
        dialogue_id, turn_idx, role, speaker, text,
        list_distinct(list_filter(regexp_split_to_array(lower(text), '[^a-z0-9'']+'), w -> w <> ''))
            AS ws
    FROM turns
),
pairs AS (
    SELECT
        a.dialogue_id,
        a.turn_idx,
        a.speaker,
        a.text,
        b.turn_idx AS earlier_turn_idx,
        b.speaker AS earlier_speaker,
        b.text AS earlier_text,
        len(list_intersect(a.ws, b.ws))
            / greatest(len(list_distinct(list_concat(a.ws, b.ws))), 1) AS similarity
    FROM words AS a
    JOIN words AS b ON a.dialogue_id = b.dialogue_id AND b.turn_idx < a.turn_idx
    WHERE a.role = 'agent'
    QUALIFY row_number() OVER (
        PARTITION BY a.dialogue_id, a.turn_idx ORDER BY similarity DESC, b.turn_idx DESC
    ) = 1
)
SELECT
    dialogue_id, turn_idx, speaker, round(similarity, 3) AS similarity, text,
    earlier_turn_idx, earlier_speaker, earlier_text
FROM pairs
ORDER BY similarity DESC, dialogue_id, turn_idx
LIMIT 20;
