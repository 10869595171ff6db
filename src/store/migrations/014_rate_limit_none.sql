-- request_events.rate_limit_per_minute is 0 for an event that carried no RateLimit-Limit (it was
-- the plan's default, 60, before): velocity_attack judges such events against the plan's or the
-- merchant's defaultLimitPerMinute, and must tell them from an event whose key's limit is 60 after a
-- restart too. Rows stored before this version keep their 60; they leave the rules' windows within the hour.
ALTER TABLE {{db}}.request_events COMMENT COLUMN rate_limit_per_minute 'limit in force for the key (RateLimit-Limit); 0 when the event carried none';
