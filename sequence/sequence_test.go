package sequence

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

func TestCheck(t *testing.T) {
	c := Config{}.WithDefaults()
	for _, tc := range []struct {
		v, last int64
		known   bool
		want    Outcome
	}{
		{5, 0, false, Applied}, {1, 0, false, Applied},
		{3, 2, true, Applied}, {2, 2, true, Stale}, {1, 2, true, Stale}, {4, 2, true, Gap},
	} {
		if got := c.Check(tc.v, tc.last, tc.known).Outcome; got != tc.want {
			t.Errorf("Check(%d, %d, %v) = %s, want %s", tc.v, tc.last, tc.known, got, tc.want)
		}
	}
	strict := Config{First: FirstMustBeOne}.WithDefaults()
	if got := strict.Check(3, 0, false); got.Outcome != Gap || got.Expected() != 1 {
		t.Errorf("FirstMustBeOne: %+v", got)
	}
}

func TestVersionReading(t *testing.T) {
	rec := func(v string) *consumer.Record {
		return &consumer.Record{Record: &kgo.Record{Headers: []kgo.RecordHeader{{Key: "version", Value: []byte(v)}}}}
	}
	c := Config{}.WithDefaults()
	if v, err := c.Version(rec("42")); err != nil || v != 42 {
		t.Fatalf("%d %v", v, err)
	}
	for _, bad := range []string{"", "x", "0", "-3", "99999999999999999999"} {
		if _, err := c.Version(rec(bad)); !errors.Is(err, ErrNoVersion) {
			t.Errorf("version %q: %v", bad, err)
		}
	}
	if _, err := c.Version(&consumer.Record{Record: &kgo.Record{}}); !errors.Is(err, ErrNoVersion) {
		t.Error("missing header accepted")
	}
	if err := (Config{Gaps: 7}).Validate(); err == nil {
		t.Error("bad policy accepted")
	}
	ctx := WithResult(context.Background(), Result{Outcome: Applied, Version: 3, First: true})
	if r, ok := FromContext(ctx); !ok || !r.First || r.Version != 3 {
		t.Errorf("FromContext %+v %v", r, ok)
	}
}

// An extractor that panics (a nil field of a payload it did not expect)
// makes the record's version unreadable: the record is poison, and the
// worker that read it goes on.
func TestPanickingExtractor(t *testing.T) {
	c := Config{Extract: func(*consumer.Record) (int64, error) {
		var m map[string]*int64
		return *m["version"], nil
	}}.WithDefaults()
	_, err := c.Version(&consumer.Record{Record: &kgo.Record{}})
	if !errors.Is(err, ErrNoVersion) || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("Version: %v; want ErrNoVersion saying the extractor panicked", err)
	}
}

// OnTimeout must be a known policy, and TimeoutAccept needs Gaps Wait,
// the only policy that waits; AcceptsLate is true once a waiting record
// passed GapTimeout.
func TestOnTimeout(t *testing.T) {
	for _, c := range []Config{{OnTimeout: 7}, {Gaps: DeadLetter, OnTimeout: TimeoutAccept}} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "OnTimeout") {
			t.Errorf("Validate(%+v) = %v; want an OnTimeout error", c, err)
		}
	}
	c := Config{OnTimeout: TimeoutAccept}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.AcceptsLate(time.Time{}) || c.AcceptsLate(time.Now()) || !c.AcceptsLate(time.Now().Add(-c.GapTimeout-time.Second)) {
		t.Error("AcceptsLate: want false for a record that never failed or just did, true past GapTimeout")
	}
	if (Config{}).WithDefaults().AcceptsLate(time.Now().Add(-24 * time.Hour)) {
		t.Error("AcceptsLate without TimeoutAccept: want false")
	}
}
