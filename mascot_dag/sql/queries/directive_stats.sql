-- Director behaviour per chosen speaker: how often each speaker was picked, and how often the
-- director's output had to be retried or replaced by the fallback directive.
SELECT
    speaker,
    count(*) AS directives,
    round(count(*) / sum(count(*)) OVER (), 3) AS share,
    count(*) FILTER (WHERE status = 'fallback') AS fallbacks,
    round(count(*) FILTER (WHERE status = 'fallback') / count(*), 3) AS fallback_rate,
    count(*) FILTER (WHERE status = 'retried') AS retries,
    round(count(*) FILTER (WHERE status = 'retried') / count(*), 3) AS retry_rate
FROM directives
GROUP BY speaker
ORDER BY directives DESC, speaker;
