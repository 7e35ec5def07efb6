-- What the inbox remembers of an identity: its outcome. 'applied' (also a
-- skip or a stale version), 'parked' (stored in the waiting table behind
-- its key's head), 'retry' (sent to retry topic stage with attempt count
-- attempt; only that hop's record runs it), 'dlt' (going to the DLT) and
-- 'dead' (the DLT acknowledged it). via names the consumed copy
-- (topic/partition/offset) that decided a 'retry' or 'dlt' outcome: a crash
-- redelivery of that copy routes it again, any other copy is a no-op.
-- Rows written before this migration are applied.
ALTER TABLE {{.Prefix}}inbox ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'applied';
ALTER TABLE {{.Prefix}}inbox ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 0;
ALTER TABLE {{.Prefix}}inbox ADD COLUMN IF NOT EXISTS stage integer NOT NULL DEFAULT 0;
ALTER TABLE {{.Prefix}}inbox ADD COLUMN IF NOT EXISTS via text NOT NULL DEFAULT '';

-- Records that arrived behind their key's head, stored once: applied from
-- here, in id (arrival) order, when the head resolves. head marks a waiting
-- record that failed when released and is being routed (retry topic or DLT)
-- as its key's new head; its row goes once the broker acknowledged it.
CREATE TABLE IF NOT EXISTS {{.Prefix}}waiting (
    id             bigserial   PRIMARY KEY,
    consumer       text        NOT NULL,
    topic          text        NOT NULL, -- the record's original topic
    key            bytea       NOT NULL,
    message_id     text        NOT NULL,
    src_topic      text        NOT NULL, -- where it was consumed from
    src_partition  integer     NOT NULL,
    src_offset     bigint      NOT NULL,
    ts             timestamptz NOT NULL,
    value          bytea,
    header_keys    text[]      NOT NULL,
    header_values  bytea[]     NOT NULL,
    version        bigint      NOT NULL DEFAULT 0,
    head           boolean     NOT NULL DEFAULT false,
    parked_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {{.Prefix}}waiting_key ON {{.Prefix}}waiting (consumer, topic, key, id);
