-- Intents of external calls (package intent): a row is written, in a
-- transaction of its own, before a handler calls a provider (a payment
-- gateway, say) with an idempotency key; it is marked done, with the
-- provider's answer, in the handler's transaction. A redelivery that finds
-- the row in flight asks the provider (reconcile) before calling again.
CREATE TABLE IF NOT EXISTS {{.Prefix}}intents (
    key        text        PRIMARY KEY,
    state      text        NOT NULL, -- in_flight | done
    result     bytea,
    attempts   integer     NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    done_at    timestamptz
);
