-- MASCOT-DAG DuckDB schema. Every table has a key; assets replace their rows (or their
-- partition's rows) inside one transaction, so re-materialising never duplicates anything.
-- JSON columns hold lists/dicts written by the lineage; query them with DuckDB's JSON functions.

CREATE TABLE IF NOT EXISTS contexts (
    context_id   VARCHAR PRIMARY KEY,
    source       VARCHAR NOT NULL,      -- empatheticdialogues | qmsum
    domain       VARCHAR NOT NULL,      -- emotional_support | academic | committee | product
    split        VARCHAR NOT NULL,      -- train | eval | ood (held out: lib/split.py)
    situation    VARCHAR NOT NULL,      -- ED situation (prompt) / QMSum topic
    text         VARCHAR NOT NULL,      -- what the agents are shown
    emotion      VARCHAR,
    valence      VARCHAR,               -- positive | negative | neutral (ED)
    meeting_id   VARCHAR,
    topic        VARCHAR,
    turns        JSON,
    queries      JSON,
    source_file  VARCHAR,
    source_ref   VARCHAR
);

CREATE TABLE IF NOT EXISTS personas (
    persona_id   VARCHAR PRIMARY KEY,   -- slug, e.g. anchor
    persona_set  VARCHAR NOT NULL,      -- support | workplace
    name         VARCHAR NOT NULL,
    role         VARCHAR NOT NULL,
    description  VARCHAR NOT NULL,
    behaviours   JSON NOT NULL,
    avoid        JSON NOT NULL,
    examples     JSON NOT NULL,
    source_file  VARCHAR NOT NULL
);

CREATE TABLE IF NOT EXISTS persona_prompts (
    persona_id    VARCHAR NOT NULL,
    style         VARCHAR NOT NULL,     -- zero_shot | few_shot | ...
    system_prompt VARCHAR NOT NULL,
    PRIMARY KEY (persona_id, style)
);

CREATE TABLE IF NOT EXISTS generation_cache (
    cache_key         VARCHAR PRIMARY KEY,
    model             VARCHAR NOT NULL,
    adapter           VARCHAR,
    adapter_version   VARCHAR,
    request           JSON NOT NULL,
    text              VARCHAR NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    created_at        TIMESTAMP DEFAULT current_timestamp
);

CREATE TABLE IF NOT EXISTS candidates (
    candidate_id      VARCHAR PRIMARY KEY,
    context_id        VARCHAR NOT NULL,
    persona_id        VARCHAR NOT NULL,
    sample_idx        INTEGER NOT NULL,
    prompt_style      VARCHAR NOT NULL,
    model             VARCHAR NOT NULL,
    text              VARCHAR NOT NULL,
    completion_tokens INTEGER NOT NULL,
    seed              INTEGER NOT NULL
);

-- Long format: one row per (target, judge, criterion). A failed judgment keeps its raw output
-- and has score NULL: it is never silently given a default score.
CREATE TABLE IF NOT EXISTS judgments (
    target_id    VARCHAR NOT NULL,      -- candidate_id
    persona_id   VARCHAR NOT NULL,      -- the persona the candidate was judged AS
    judge        VARCHAR NOT NULL,
    criterion    VARCHAR NOT NULL,
    score        DOUBLE,
    rationale    VARCHAR,
    status       VARCHAR NOT NULL,      -- ok | failed
    raw_output   VARCHAR,
    PRIMARY KEY (target_id, persona_id, judge, criterion)
);

CREATE TABLE IF NOT EXISTS preference_pairs (
    pair_id       VARCHAR PRIMARY KEY,
    context_id    VARCHAR NOT NULL,
    persona_id    VARCHAR NOT NULL,
    chosen_id     VARCHAR NOT NULL,
    rejected_id   VARCHAR NOT NULL,
    chosen_score  DOUBLE NOT NULL,
    rejected_score DOUBLE NOT NULL,
    margin        DOUBLE NOT NULL
);

-- The persona probe (persona_adapters' check): one row per (context, persona, seed, arm, format).
-- Arms: base (persona prompt, no adapter), warm_start (after the persona SFT), adapter (after
-- GRPO). Formats: training (the group-dialogue request) and chat (system prompt + the user's
-- message). Which persona each text sounds like is in probe_readings, one row per reader.
CREATE TABLE IF NOT EXISTS persona_probe (
    persona_id    VARCHAR NOT NULL,
    context_id    VARCHAR NOT NULL,
    seed          INTEGER NOT NULL,
    arm           VARCHAR NOT NULL,
    format        VARCHAR NOT NULL,
    model_version VARCHAR NOT NULL,
    text          VARCHAR NOT NULL,
    consistency   DOUBLE,              -- embedded judge, 1-5
    relevance     DOUBLE,              -- embedded judge, 1-5
    copied        DOUBLE NOT NULL,     -- shares a content 4-gram with its card (0/1)
    PRIMARY KEY (persona_id, context_id, seed, arm, format)
);

-- The probe panel (lib/stage1/readers.py): each reader's persona for each persona_probe text.
CREATE TABLE IF NOT EXISTS probe_readings (
    persona_id    VARCHAR NOT NULL,
    context_id    VARCHAR NOT NULL,
    seed          INTEGER NOT NULL,
    arm           VARCHAR NOT NULL,
    format        VARCHAR NOT NULL,
    reader        VARCHAR NOT NULL,    -- lexical | semantic | judge
    predicted     VARCHAR,             -- NULL: the reader named no persona of the roster
    identifiable  DOUBLE NOT NULL,     -- predicted = persona_id (0/1)
    PRIMARY KEY (persona_id, context_id, seed, arm, format, reader)
);

-- Each reader's validity: accuracy on reference utterances it did not learn from (5-fold for
-- fitted readers). Below the panel's minimum a reader's gain does not count (lib/stage1/panel.py).
CREATE TABLE IF NOT EXISTS probe_readers (
    persona_set   VARCHAR NOT NULL,
    reader        VARCHAR NOT NULL,
    accuracy      DOUBLE NOT NULL,
    PRIMARY KEY (persona_set, reader)
);

-- Dialogues of both Stage 2 rollouts (stage = 'rollout') and evaluation (stage = 'eval').
CREATE TABLE IF NOT EXISTS dialogues (
    dialogue_id   VARCHAR PRIMARY KEY,
    stage         VARCHAR NOT NULL,     -- rollout | eval
    method        VARCHAR NOT NULL,     -- mascot | zero_shot | ... (rollout: mascot)
    context_id    VARCHAR NOT NULL,
    mode          VARCHAR NOT NULL,     -- support | meeting
    user_profile  VARCHAR,              -- MBTI type in support mode
    seed          INTEGER NOT NULL,
    n_turns       INTEGER NOT NULL,
    models        JSON                  -- persona -> adapter version or 'base', director version
);

CREATE TABLE IF NOT EXISTS turns (
    dialogue_id   VARCHAR NOT NULL,
    turn_idx      INTEGER NOT NULL,
    role          VARCHAR NOT NULL,     -- agent | user
    speaker       VARCHAR NOT NULL,     -- persona_id, 'user' or 'assistant'
    text          VARCHAR NOT NULL,
    model_used    VARCHAR,              -- adapter version, 'base+prompt', ...
    PRIMARY KEY (dialogue_id, turn_idx)
);

CREATE TABLE IF NOT EXISTS directives (
    dialogue_id   VARCHAR NOT NULL,
    turn_idx      INTEGER NOT NULL,
    speaker       VARCHAR NOT NULL,
    action        VARCHAR NOT NULL,
    tone          VARCHAR NOT NULL,
    status        VARCHAR NOT NULL,     -- ok | retried | fallback
    raw_output    VARCHAR,
    PRIMARY KEY (dialogue_id, turn_idx)
);

CREATE TABLE IF NOT EXISTS group_judgments (
    dialogue_id  VARCHAR NOT NULL,
    block_idx    INTEGER NOT NULL,
    judge        VARCHAR NOT NULL,
    criterion    VARCHAR NOT NULL,
    score        DOUBLE,
    rationale    VARCHAR,
    status       VARCHAR NOT NULL,
    raw_output   VARCHAR,
    PRIMARY KEY (dialogue_id, block_idx, judge, criterion)
);

CREATE TABLE IF NOT EXISTS eval_scores (
    method           VARCHAR NOT NULL,
    dialogue_id      VARCHAR NOT NULL,
    level            VARCHAR NOT NULL,  -- agent | collective | automatic
    judge            VARCHAR NOT NULL,  -- judge name, or 'metric' for automatic metrics
    criterion        VARCHAR NOT NULL,
    value            DOUBLE,
    higher_is_better BOOLEAN,          -- NULL: no quality direction (e.g. response length)
    PRIMARY KEY (method, dialogue_id, level, judge, criterion)
);

-- Agent-level judge scores per agent turn (eval_scores holds their dialogue means): what the
-- report's persona x simulated-user (MBTI) table needs, since a dialogue mixes personas.
CREATE TABLE IF NOT EXISTS eval_turn_scores (
    method           VARCHAR NOT NULL,
    dialogue_id      VARCHAR NOT NULL,
    turn_idx         INTEGER NOT NULL,
    speaker          VARCHAR NOT NULL,  -- persona_id or 'assistant'
    judge            VARCHAR NOT NULL,
    criterion        VARCHAR NOT NULL,
    value            DOUBLE,            -- 1-5; NULL when the judgment failed
    PRIMARY KEY (dialogue_id, turn_idx, judge, criterion)
);

CREATE TABLE IF NOT EXISTS comparisons (
    comparison_id  VARCHAR PRIMARY KEY,
    context_id     VARCHAR NOT NULL,
    judge          VARCHAR NOT NULL,
    shown_order    JSON NOT NULL,       -- methods in the order the judge saw them
    winner         VARCHAR,             -- NULL when the judge failed
    status         VARCHAR NOT NULL
);

-- Blind human evaluation (`mascot rate`, lib/human.py): per rater, one three-way item (an eval
-- context with MASCOT and two other methods, as in `comparisons`) gets a 1-5 score per dialogue
-- and criterion, and one best pick. A re-submission replaces the rater's rows for that item in
-- both tables in one transaction.
CREATE TABLE IF NOT EXISTS human_ratings (
    item_id        VARCHAR NOT NULL,    -- <context_id>:<k>, the comparison id without its judge
    rater          VARCHAR NOT NULL,    -- name or token the rater gave
    dialogue_id    VARCHAR NOT NULL,
    method         VARCHAR NOT NULL,    -- hidden from the rater
    context_id     VARCHAR NOT NULL,
    level          VARCHAR NOT NULL,    -- agent | collective
    criterion      VARCHAR NOT NULL,
    score          INTEGER NOT NULL CHECK (score BETWEEN 1 AND 5),
    shown_position INTEGER NOT NULL,    -- 0, 1, 2 = shown as A, B, C to this rater
    submitted_at   TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (item_id, rater, dialogue_id, criterion)
);

CREATE TABLE IF NOT EXISTS human_choices (
    item_id          VARCHAR NOT NULL,
    rater            VARCHAR NOT NULL,
    context_id       VARCHAR NOT NULL,
    shown_order      JSON NOT NULL,     -- methods in the order this rater saw them (A, B, C)
    best_dialogue_id VARCHAR NOT NULL,
    best_method      VARCHAR NOT NULL,
    comment          VARCHAR,
    submitted_at     TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (item_id, rater)
);

-- People as a reader of the persona probe (`mascot rate`, page /who; lib/evaluation/human_roles.py):
-- which companion of the roster said a persona_probe text, one row per rater and text. The rater
-- saw the text and utterance_id only; a re-answer replaces the row. An answer whose utterance_id
-- no longer matches the text's (the probe was re-run) is not counted.
CREATE TABLE IF NOT EXISTS human_role_answers (
    rater         VARCHAR NOT NULL,    -- name or token the rater gave
    persona_id    VARCHAR NOT NULL,    -- the text's intended persona (hidden from the rater)
    context_id    VARCHAR NOT NULL,
    seed          INTEGER NOT NULL,
    arm           VARCHAR NOT NULL,    -- base | adapter (hidden from the rater)
    format        VARCHAR NOT NULL,
    utterance_id  VARCHAR NOT NULL,    -- opaque id shown: SHA-256 of the key and the text
    answer        VARCHAR,             -- the persona id the rater named; NULL: can't tell
    answered_at   TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (rater, persona_id, context_id, seed, arm, format)
);

-- Trained vs base director (director_comparison, lib/director_eval.py): one row per unit (a
-- held-out context x seed, same opening, users and seeds in both arms) and arm (base | trained).
-- Rates are shares of the unit's director decisions; group_reward is the group judge's
-- collective score on 0-1 (the director GRPO reward's scale), mean over the dialogue's blocks.
CREATE TABLE IF NOT EXISTS director_comparison (
    dialogue_id       VARCHAR NOT NULL,   -- dircmp:s<k>:<context_id>
    context_id        VARCHAR NOT NULL,
    mode              VARCHAR NOT NULL,
    seed              INTEGER NOT NULL,
    arm               VARCHAR NOT NULL,   -- base | trained
    director          VARCHAR NOT NULL,   -- adapter name (mascot-director@vN) or base
    decisions         INTEGER NOT NULL,
    ok_first          INTEGER NOT NULL,
    retried           INTEGER NOT NULL,
    fallback          INTEGER NOT NULL,
    valid_first       DOUBLE,
    retry_rate        DOUBLE,
    fallback_rate     DOUBLE,
    distinct_speakers DOUBLE,
    speaker_entropy   DOUBLE,             -- bits
    group_reward      DOUBLE,             -- 0-1; NULL when the judge failed every block
    blocks            INTEGER NOT NULL,
    speakers          JSON NOT NULL,      -- agent speakers in turn order
    statuses          JSON NOT NULL,      -- directive statuses in turn order
    PRIMARY KEY (dialogue_id, arm)
);
