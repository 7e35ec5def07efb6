package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/outbox"
)

// outbox status shows the rows not published yet, per partition, and the
// relay's position once it has published them.
func TestOutboxStatus(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	createTopic(t, k, "events", 1)
	url := testenv.DatabaseT(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	w := outbox.Writer{Partitions: 2}
	for i := range 5 {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Add(ctx, tx, &kgo.Record{Topic: "events", Key: []byte("k"), Value: []byte(fmt.Sprint(i))})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	o := outbox.Options{Brokers: k.Brokers, Pool: pool, Partitions: 2, OwnPartitions: []int{0, 1}, PollInterval: 20 * time.Millisecond}
	r, err := outbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	testenv.WaitFor(t, time.Minute, "the relay publishing", func() bool { return r.Stats().Published == 5 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	res := kscope(t, "outbox", "status", brokers(k), "--database-url", url, "--partitions", "2")
	res.want(t, exitOK, "PARTITION", "POSITION", "PENDING", "0 rows pending")
	// A row written while no relay runs is pending, with its age.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Add(ctx, tx, &kgo.Record{Topic: "events", Key: []byte("k"), Value: []byte("late")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	res = kscope(t, "outbox", "status", brokers(k), "--database-url", url, "--partitions", "2", "--json")
	res.want(t, exitOK, `"position":5`, `"pending":1`)

	// A Writer with more partitions than the relay writes a row to a
	// partition no relay publishes: status lists it as such, after the
	// relay's partitions, and says what to do.
	wide := outbox.Writer{Partitions: 8}
	var id string
	for i := 0; ; i++ {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err = wide.Add(ctx, tx, &kgo.Record{Topic: "events", Key: fmt.Appendf(nil, "key-%d", i), Value: []byte("wide")})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if part := strings.Split(id, "/")[1]; part != "0" && part != "1" {
			break
		}
	}
	part := strings.Split(id, "/")[1]
	res = kscope(t, "outbox", "status", brokers(k), "--database-url", url, "--partitions", "2")
	res.want(t, exitOK, part+"  ", "no relay", "1 row in partitions "+part+", outside the outbox's 2", "Writer.Partitions must be the relay's")
	res = kscope(t, "outbox", "status", brokers(k), "--database-url", url, "--partitions", "2", "--json")
	res.want(t, exitOK, `{"partition":`+part+`,"position":0,"pending":1,`, `"stranded":true}`)
}
