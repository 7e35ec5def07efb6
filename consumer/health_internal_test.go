package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A poll loop away from polling for 2 minutes makes the runner not live;
// one that waits in a poll (or for in-flight room, or for its scope) that
// long does not.
func TestHealthStuckPollLoop(t *testing.T) {
	r, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}}, HandlerFunc(func(context.Context, *Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	r.runBegins()
	r.sessionBegins()
	r.joined.Store(true)
	if h := r.Health(); !h.Live || !h.Ready {
		t.Fatalf("a running, joined runner: %+v", h)
	}
	r.loopBeat.wait()
	r.loopBeat.at.Store(time.Now().Add(-3 * time.Minute).UnixNano())
	if h := r.Health(); !h.Live {
		t.Fatalf("a loop waiting in a poll for 3 minutes is not live: %v", h.NotLive)
	}
	r.loopBeat.waiting.Store(false)
	h := r.Health()
	if h.Live || h.Ready || len(h.NotLive) != 1 || !strings.Contains(h.NotLive[0], "poll loop") {
		t.Fatalf("a loop away from polling for 3 minutes: live %v ready %v, reasons %v", h.Live, h.Ready, h.NotLive)
	}
	// A loop that waits for its scope (Stats.Waiting: a changelog
	// restore) is not stuck, and not ready.
	unit := r.unit
	r.unit = waitingScope{unit, "the versions of 2 of the 2 assigned partitions are being restored"}
	if h := r.Health(); !h.Live || h.Ready || !strings.Contains(strings.Join(h.NotReady, "\n"), "the scope has not started: the versions of 2") {
		t.Fatalf("a loop away from polling for 3 minutes while its scope restores: live %v ready %v, reasons %v %v", h.Live, h.Ready, h.NotLive, h.NotReady)
	}
	r.unit = unit
	r.loopBeat.back()
	r.failures = &failures{}
	r.failures.hold.shards, r.failures.hold.err = 2, errors.New(`relation "inbox" does not exist`)
	if h := r.Health(); !h.Live || h.Ready || !strings.Contains(strings.Join(h.NotReady, "\n"), `2 key-shards hold since`) || !strings.Contains(strings.Join(h.NotReady, "\n"), `"inbox"`) {
		t.Fatalf("key-shards holding on a deployment error: live %v ready %v, reasons %v", h.Live, h.Ready, h.NotReady)
	}
	r.failures = nil
	r.runEnds(nil)
	if h := r.Health(); !h.Live || h.Ready {
		t.Fatalf("after a clean stop: live %v ready %v, want live and not ready", h.Live, h.Ready)
	}
}

// waitingScope is a scope that waits for what it needs (Stats.Waiting).
type waitingScope struct {
	workScope
	why string
}

func (w waitingScope) ReportStats(st *Stats) { st.Waiting = w.why }

// The brokers are down only when no request reached one for 5 s and one
// failed since the last that did.
func TestBrokerHealthDown(t *testing.T) {
	var b brokerHealth
	now := time.Now()
	at := func(d time.Duration) int64 { return now.Add(-d).UnixNano() }
	b.lastErr = errors.New("connection refused")
	for _, c := range []struct {
		ok, fail time.Duration
		down     bool
	}{
		{ok: 6 * time.Second, fail: time.Second, down: true},
		{ok: 4 * time.Second, fail: time.Second, down: false},       // not for 5 s yet
		{ok: 20 * time.Second, fail: 30 * time.Second, down: false}, // idle, nothing failed since
	} {
		b.okAt.Store(at(c.ok))
		b.failAt.Store(at(c.fail))
		if since, _ := b.down(now); !since.IsZero() != c.down {
			t.Errorf("last success %s ago, last failure %s ago: down since %v, want down %v", c.ok, c.fail, since, c.down)
		}
	}
}
