package consumer

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestStallWatchSeesEveryHandlerCall: the stall watch takes every handler
// call begun or ended as the key-shard moving, a retry in place of the
// same record too (its marks come back to the same value), and names the
// record whose handler runs; a key-shard whose marks do not change for
// StallWarning is stalled, in its handler or after it.
func TestStallWatchSeesEveryHandlerCall(t *testing.T) {
	r, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Logger: slog.New(slog.DiscardHandler)},
		HandlerFunc(func(context.Context, *Record) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	a := &Record{Record: &kgo.Record{Topic: "t", Key: []byte("a"), Offset: 7}, offset: 7}
	b := &Record{Record: &kgo.Record{Topic: "t", Key: []byte("b"), Offset: 9}, offset: 9}
	d := &doneBuf{r: r}
	d.begin([]*Record{a, b})
	var w shardWatch
	now := time.Now()
	r.lookAt(0, d, &w, now)

	// look lets a whole StallWarning pass after step, then looks.
	look := func(what string, step func(), wantMoved bool) {
		t.Helper()
		now = now.Add(r.cfg.StallWarning)
		step()
		r.lookAt(0, d, &w, now)
		if moved := w.since.Equal(now); moved != wantMoved {
			t.Fatalf("%s: the watch saw the key-shard move: %v, want %v", what, moved, wantMoved)
		}
		if w.stalled == wantMoved {
			t.Fatalf("%s: stalled = %v, want %v", what, w.stalled, !wantMoved)
		}
	}
	look("a's handler begun", func() { d.handlerCall(a, true) }, true)
	look("a failed and was retried in place", func() { d.handlerCall(a, false); d.handlerCall(a, true) }, true)
	look("a failed again, retried again", func() { d.handlerCall(a, false); d.handlerCall(a, true) }, true)
	look("nothing", func() {}, false)
	if !w.rec.inHandler || w.rec.offset != 7 {
		t.Fatalf("the stall names offset %d (in its handler: %v); want 7, in its handler", w.rec.offset, w.rec.inHandler)
	}
	look("a returned, b begun", func() { d.handlerCall(a, false); d.handlerCall(b, true) }, true)
	look("b returned", func() { d.handlerCall(b, false) }, true)
	look("nothing after b's handler", func() {}, false)
	if w.rec.inHandler || w.rec.offset != 7 {
		t.Fatalf("after b's handler returned, the stall names offset %d (in its handler: %v); want 7, the first not done, not in a handler", w.rec.offset, w.rec.inHandler)
	}
	d.end()
	look("the batch ended", func() {}, true)
}
