-- The transactional outbox (package outbox): records a service writes in
-- the same transaction as the state change that caused them, published by
-- a relay. Rows are split into partitions by key hash; within a partition
-- seq is gapless and in commit order, because the sequence row below is
-- locked from the insert until the writing transaction ends.
CREATE TABLE IF NOT EXISTS {{.Prefix}}outbox_sequences (
    outbox    text    NOT NULL,
    partition integer NOT NULL,
    next_seq  bigint  NOT NULL,
    PRIMARY KEY (outbox, partition)
);

CREATE TABLE IF NOT EXISTS {{.Prefix}}outbox (
    outbox     text        NOT NULL,
    partition  integer     NOT NULL,
    seq        bigint      NOT NULL,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    headers    bytea,                  -- encoded by package outbox
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (outbox, partition, seq)
);

-- Wakes the relay when a writing transaction commits (notifications are
-- delivered at commit, one per distinct payload).
CREATE OR REPLACE FUNCTION {{.Prefix}}outbox_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('{{.Prefix}}outbox', NEW.outbox || '/' || NEW.partition);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS {{.Prefix}}outbox_notify ON {{.Prefix}}outbox;
CREATE TRIGGER {{.Prefix}}outbox_notify AFTER INSERT ON {{.Prefix}}outbox
    FOR EACH ROW EXECUTE FUNCTION {{.Prefix}}outbox_notify();
