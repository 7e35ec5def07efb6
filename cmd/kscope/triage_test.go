package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/retrytopic"
)

// waitingGauge returns kscope_dead_letters_waiting of group's dead-letter
// topic, and whether the series is there.
func waitingGauge(t *testing.T, m *kscopeprom.Metrics, group string) (float64, bool) {
	t.Helper()
	mfs, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kscope_dead_letters_waiting" {
			continue
		}
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer_group"] == group && labels["topic"] == retrytopic.DLTopic(group) {
				return s.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// kscope_dead_letters_waiting counts a runner's dead letters as they come,
// and falls as kscope dlt redrive (the built binary) handles them: a
// redrive of every record to the end, and a filtered one up to the first
// record its filter passes over. kscope dlt list prints the same count.
func TestDeadLettersWaitingRiseWithDeadLettersAndFallWithRedrives(t *testing.T) {
	ctx := context.Background()
	k := testenv.KafkaT(t)
	const src, group = "triage-src", "triage"
	createTopic(t, k, src, 1)
	var applied atomic.Int64
	// One key-shard: the dead letters reach the dead-letter topic in the
	// order of their sources, which the filtered redrive's commit below
	// names (with several, c and d may land in either order).
	cfg := consumer.Config{Brokers: k.Brokers, Group: group, Topics: []string{src}, Shards: 1, CommitInterval: 50 * time.Millisecond, Owner: "payments <#payments-oncall>"}
	r, err := consumer.New(cfg, consumer.HandlerFunc(func(_ context.Context, rec *consumer.Record) error {
		if _, redriven := rec.Header(retrytopic.HeaderRedrive); !redriven {
			return consumer.Terminal(errors.New("rejected until fixed"))
		}
		applied.Add(1)
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- r.Run(rctx) }()
	go func() { done <- m.WatchDeadLetters(rctx, cfg, 20*time.Millisecond) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	waitFor := func(what string, want float64) {
		t.Helper()
		testenv.WaitFor(t, time.Minute, what, func() bool { v, ok := waitingGauge(t, m, group); return ok && v == want })
	}
	produce := func(keys ...string) {
		for _, key := range keys {
			if err := k.Produce(ctx, &kgo.Record{Topic: src, Key: []byte(key), Value: []byte(key)}); err != nil {
				t.Fatal(err)
			}
		}
	}

	produce("a", "b")
	waitFor("2 dead letters waiting", 2)
	bin := kscopeBinary(t)
	rd := kscopeBin(t, bin, nil, "dlt", "redrive", brokers(k), "--group", group, "--to", "source", "--rate", "0")
	rd.want(t, exitOK, "committed partition 0 offset 2 under group triage.kscope-triage")
	testenv.WaitFor(t, time.Minute, "both redriven records applied", func() bool { return applied.Load() == 2 })
	waitFor("none waiting after the redrive", 0)

	// A filtered redrive commits up to the first record it passes over.
	produce("c", "d")
	waitFor("2 new dead letters waiting", 2)
	rd = kscopeBin(t, bin, nil, "dlt", "redrive", brokers(k), "--group", group, "--to", "source", "--key", "c", "--rate", "0")
	rd.want(t, exitOK, "committed partition 0 offset 3")
	waitFor("d still waiting", 1)
	kscopeBin(t, bin, nil, "dlt", "list", brokers(k), "--group", group).want(t, exitOK, "1 waiting for triage")
}
