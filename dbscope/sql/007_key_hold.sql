-- The circuit breaker of each key (consumer.Config.KeyBreaker): a key whose
-- records keep failing is held alone, in PostgreSQL. Its parked row has
-- held set: the record whose failure held the key (its head) is stored in
-- the waiting table, first, with the key's later records behind it, and
-- runs again as the key's probe once probe_at has passed; probes counts the
-- probes that failed in a row (each doubles the cool-down). The held
-- record's inbox status is 'parked', as for any record waiting in the
-- waiting table. A record held as it is consumed is stored with a negative
-- id (minus a value of the table's id sequence), so that it is applied
-- before the records already waiting behind it (its key's head in the
-- retry topics, when it was that head).
ALTER TABLE {{.Prefix}}parked ADD COLUMN IF NOT EXISTS held boolean NOT NULL DEFAULT false;
ALTER TABLE {{.Prefix}}parked ADD COLUMN IF NOT EXISTS probe_at timestamptz;
ALTER TABLE {{.Prefix}}parked ADD COLUMN IF NOT EXISTS probes integer NOT NULL DEFAULT 0;
-- The recovery pass's look-up of the held keys whose probe is due.
CREATE INDEX IF NOT EXISTS {{.Prefix}}parked_held ON {{.Prefix}}parked (consumer, probe_at) WHERE held;
