-- Per-key ordered retries: the records of a key that are in the retry
-- topics. While a key has rows here, its later records do not run: they go
-- to the retry topic of the oldest one (the head) and wait behind it. A row
-- is deleted when its record succeeds, is skipped or is dead-lettered.
CREATE TABLE IF NOT EXISTS {{.Prefix}}parked (
    consumer        text        NOT NULL,
    topic           text        NOT NULL, -- the record's original topic
    key             bytea       NOT NULL,
    message_id      text        NOT NULL,
    original_offset bigint      NOT NULL,
    stage           integer     NOT NULL, -- the retry topic (ladder step) it is in
    parked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, key, message_id)
);
