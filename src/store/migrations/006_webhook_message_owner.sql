-- Which replica attempts a webhook message. Every replica reads the same pending messages; without an
-- owner, each would attempt each one (on-call paged once per replica). The replica that creates a
-- message owns it; another adopts it only once it is overdue (its owner is presumably gone) and owns
-- it from its first attempt on. Messages written before this column (owner '') are anyone's.
ALTER TABLE {{db}}.webhook_messages
    ADD COLUMN IF NOT EXISTS owner String DEFAULT '' COMMENT 'WORKER_ID of the replica that attempts it; empty: any replica' AFTER status;
