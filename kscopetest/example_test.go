package kscopetest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/kscopetest"
)

// A service's test hands its pipeline to the kit: the handler, the schema,
// how to make an input, how to count effects.
func ExampleDB() {
	_ = func(t *testing.T) {
		report := kscopetest.DB(t, kscopetest.DBPipeline{
			Handler: dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
				var order struct{ ID string }
				if err := json.Unmarshal(r.Value, &order); err != nil {
					return consumer.DecodeError(err)
				}
				_, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, order.ID)
				return err
			}),
			Schema: `CREATE TABLE orders (id text)`,
			Valid: func(i int) *kgo.Record {
				return &kgo.Record{Value: []byte(fmt.Sprintf(`{"ID":"o-%d"}`, i))}
			},
			Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
			Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
				err = db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
				return n, err
			},
		})
		for _, r := range report {
			t.Logf("%s held=%v %s", r.Scenario, r.Held, r.Detail)
		}
	}
}

// A minimal pipeline passes every scenario; this also runs the kit on
// kscope's own tests.
func TestKitOnAMinimalPipeline(t *testing.T) {
	rep := kscopetest.DB(t, ordersPipeline())
	if !rep.Held() {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep {
		if len(r.Repeats) > 0 {
			t.Fatalf("%s: records handled again: %v", r.Scenario, r.Repeats)
		}
	}
	var skipped []string
	for _, r := range rep {
		if r.Skipped {
			if r.Held || !strings.HasPrefix(r.Detail, "not applicable: ") {
				t.Fatalf("skipped %s: held %v, detail %q; want not held, and why", r.Scenario, r.Held, r.Detail)
			}
			skipped = append(skipped, r.Scenario)
		}
	}
	if len(skipped) != 1 || skipped[0] != "out_of_order_versions" {
		t.Fatalf("scenarios not applied: %v (only the version one should be, for an unversioned pipeline)", skipped)
	}
}

// The same pipeline, run as a member of a share group: the kit's
// share-group table (duplicates, a lock that expired, poison, a crash
// mid-transaction, a replay).
func ExampleDBShare() {
	_ = func(t *testing.T, p kscopetest.DBPipeline) { // p: the service's pipeline, as in ExampleDB
		p.Config = func(c consumer.Config) consumer.Config {
			c.Share = &consumer.ShareConfig{MaxDeliveries: 3}
			return c
		}
		report := kscopetest.DBShare(t, p)
		if !report.Held() {
			t.Fatalf("%+v", report)
		}
	}
}
