-- Version-gap detection: the last applied version per key. Read with a row
-- lock, checked and advanced in the transaction that applies the record.
CREATE TABLE IF NOT EXISTS {{.Prefix}}key_versions (
    consumer   text        NOT NULL,
    topic      text        NOT NULL, -- the record's original topic
    key        bytea       NOT NULL,
    version    bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, key)
);

-- A parked record's version: records of a version below a waiting gap's
-- fill the gap and are not held behind it.
ALTER TABLE {{.Prefix}}parked ADD COLUMN IF NOT EXISTS version bigint;
