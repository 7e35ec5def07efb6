-- The inbox: one row per message a consumer applied. Its primary key is the
-- dedupe check: a record whose (consumer, message_id) is already here has
-- had its effect applied and is skipped.
CREATE TABLE IF NOT EXISTS {{.Prefix}}inbox (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Retention deletes by age.
CREATE INDEX IF NOT EXISTS {{.Prefix}}inbox_processed_at ON {{.Prefix}}inbox (consumer, processed_at);
