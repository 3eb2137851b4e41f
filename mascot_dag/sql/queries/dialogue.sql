-- One dialogue, turn by turn, with the director's directive for each agent turn.
-- Parameter: $dialogue_id (e.g. mascot query dialogue --param dialogue_id=...).
SELECT
    t.turn_idx,
    t.role,
    t.speaker,
    t.text,
    d.action AS directive_action,
    d.tone AS directive_tone,
    d.status AS directive_status,
    t.model_used
FROM turns AS t
LEFT JOIN directives AS d USING (dialogue_id, turn_idx)
WHERE t.dialogue_id = $dialogue_id
ORDER BY t.turn_idx;
