package dbscope_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// In the DB scope too, a dead letter carries the group's owner
// (consumer.Config.Owner) in its kscope-owner header.
func TestDBDeadLetterCarriesTheOwner(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	pool := newPool(t)
	const topic, group, owner = "db-owned", "g-db-owned", "ledger <ledger@example.com>"
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("poison")}); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(k, group, topic)
	cfg.Owner = owner
	r, err := dbscope.New(cfg, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(
		func(context.Context, pgx.Tx, *consumer.Record) error {
			return consumer.DecodeError(errors.New("not JSON"))
		}))
	if err != nil {
		t.Fatal(err)
	}
	runToEnd(t, r, k, group, topic, "the record done", time.Minute, func() bool { return r.Stats().Done == 1 })
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if len(dlt) != 1 || testenv.Header(dlt[0], retrytopic.HeaderOwner) != owner {
		t.Fatalf("DLT %v: want one record with owner %q", dlt, owner)
	}
}
