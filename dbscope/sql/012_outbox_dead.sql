-- Outbox rows that Kafka refuses for good (package outbox): larger than
-- the producer's or the topic's size limit, or a record the broker rejects
-- as such, each refused alone. The relay moves such a row here, with why
-- and when, before the Kafka transaction that carries the partition's
-- position past it commits, and the partition goes on with the next rows.
-- A row is the outbox row it was (its identity is
-- "<outbox>/<partition>/<seq>", the kscope-id header it would have
-- carried); a relay that retries after a crash inserts it again as a
-- no-op. Nothing deletes these rows: an operator publishes or discards
-- them.
CREATE TABLE IF NOT EXISTS {{.Prefix}}outbox_dead (
    outbox     text        NOT NULL,
    partition  integer     NOT NULL,
    seq        bigint      NOT NULL,
    topic      text        NOT NULL,
    key        bytea,
    value      bytea,
    headers    bytea,                  -- encoded by package outbox, as in the outbox table
    created_at timestamptz NOT NULL,   -- when the writing transaction added the row
    error      text        NOT NULL,   -- what the producer or the broker answered
    dead_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (outbox, partition, seq)
);
