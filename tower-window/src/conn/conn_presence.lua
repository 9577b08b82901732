-- Counts a subject's live seats (read only).
-- KEYS[1]  the subject's seat set; ARGV[1] now (µs) or '' (Redis TIME)
return redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
