package kscopeprom_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/kscopeprom"
)

// WatchDeadLetters refuses a Config it cannot count for at once, and a
// count that fails leaves the series out instead of showing a stale value.
func TestWatchDeadLettersRefusesAndLeavesOutWhatItCannotCount(t *testing.T) {
	m, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.WatchDeadLetters(ctx, consumer.Config{Group: "g"}, time.Second); err == nil || !strings.Contains(err.Error(), "Brokers and Group") {
		t.Fatalf("no brokers: %v", err)
	}
	if err := m.WatchDeadLetters(ctx, consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g"}, -time.Second); err == nil || !strings.Contains(err.Error(), "positive") {
		t.Fatalf("negative interval: %v", err)
	}
	var logs strings.Builder
	cfg := consumer.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		ClientOptions: []kgo.Opt{kgo.RetryTimeout(100 * time.Millisecond), kgo.DialTimeout(100 * time.Millisecond)}}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := m.WatchDeadLetters(wctx, cfg, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "counting the dead letters waiting for triage failed") {
		t.Fatalf("no WARN of the failed count:\n%s", logs.String())
	}
	out, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range out {
		if mf.GetName() == "kscope_dead_letters_waiting" && len(mf.GetMetric()) > 0 {
			t.Fatalf("a series without a count: %v", mf)
		}
	}
}
