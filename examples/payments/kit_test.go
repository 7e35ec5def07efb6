package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/kscopetest"
)

// The payments pipeline passes kscope's delivery-semantics test kit.
func TestPaymentsDeliverySemantics(t *testing.T) {
	gw, err := startGateway()
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	g := newGateway(gw.URL)
	defer g.intents.Close()
	fail, err := failures()
	if err != nil {
		t.Fatal(err)
	}
	opts, err := options(nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := kscopetest.DB(t, kscopetest.DBPipeline{
		Handler: dbscope.HandlerFunc(g.handle),
		Schema:  ledgerDDL,
		Options: opts,
		Config: func(c consumer.Config) consumer.Config {
			c.Failures.Ladder = fail.Ladder
			return c
		},
		Valid: func(i int) *kgo.Record {
			body, _ := json.Marshal(Capture{Intent: fmt.Sprintf("pi_kit_%d", i), Account: "acct-kit", Amount: 1000, Gateway: "ok"})
			return &kgo.Record{Value: body}
		},
		Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("{amount: ???")} },
		Effects: func(ctx context.Context, db *pgxpool.Pool) (n int, err error) {
			err = db.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
			return n, err
		},
	})
	for _, r := range rep {
		t.Logf("%-30s held=%v %s", r.Scenario, r.Held, r.Detail)
	}
}
