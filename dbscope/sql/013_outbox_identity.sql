-- An outbox row's identity (the kscope-id header of its record) is
-- "<outbox>/<partition>/<seq>" of the row, unless id holds one: a row
-- moved back from the dead-letter table (kscope outbox dead requeue)
-- gets a new place at the end of its partition, through the sequence row
-- like any other, and keeps the identity it was written with, so that a
-- consumer that saw the record already drops the copy. A dead-letter row
-- keeps the id of the outbox row it was. NULL for every row written by
-- outbox.Add and Queue.
ALTER TABLE {{.Prefix}}outbox ADD COLUMN IF NOT EXISTS id text;
ALTER TABLE {{.Prefix}}outbox_dead ADD COLUMN IF NOT EXISTS id text;
