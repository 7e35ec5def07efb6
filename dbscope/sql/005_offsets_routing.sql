-- The routing of records to key-shards a stored position was written under
-- (shard count, null-key policy, shard hash). A position says which records
-- routed to its shard are durable, so it is used only under the same
-- routing; rows written before this column have none and are not used.
ALTER TABLE {{.Prefix}}offsets ADD COLUMN IF NOT EXISTS routing text NOT NULL DEFAULT '';
