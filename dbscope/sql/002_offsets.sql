-- Consumed positions kept in the database, written in the same transaction
-- as the effects (Options.StoreOffsets). Each key-shard applies a
-- partition's records in offset order, so next_offset per (partition, shard)
-- says that every record of the partition routed to that shard below it is
-- durable. Rows written with another shard count are ignored.
CREATE TABLE IF NOT EXISTS {{.Prefix}}offsets (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    shard       integer     NOT NULL,
    shards      integer     NOT NULL,
    next_offset bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition, shard)
);
