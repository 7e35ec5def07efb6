package sequence

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
)

// A version header comes from any producer: whatever it holds, Version
// returns either a version >= 1 that is the header's decimal value,
// or an error wrapping ErrNoVersion (the record is poison), never a panic;
// and the error quotes at most a bounded part of the header.
func FuzzVersion(f *testing.F) {
	f.Add("1", true)
	f.Add("0", true)
	f.Add("-3", true)
	f.Add("9223372036854775807", true)
	f.Add("9223372036854775808", true)
	f.Add(" 7", true)
	f.Add("\xff\xfe", true)
	f.Add("", false)
	f.Fuzz(func(t *testing.T, header string, present bool) {
		r := &kgo.Record{Topic: "t"}
		if present {
			r.Headers = []kgo.RecordHeader{{Key: DefaultHeader, Value: []byte(header)}}
		}
		v, err := Config{}.WithDefaults().Version(&consumer.Record{Record: r})
		if err != nil {
			if !errors.Is(err, ErrNoVersion) {
				t.Fatalf("error %v does not wrap ErrNoVersion", err)
			}
			if len(err.Error()) > 300 {
				t.Fatalf("error of %d bytes quotes the whole header", len(err.Error()))
			}
			return
		}
		if n, perr := strconv.ParseInt(header, 10, 64); v < 1 || perr != nil || n != v {
			t.Fatalf("header %q read as version %d", header, v)
		}
	})
}

// Check's outcome follows the documented table for every version, last
// applied version and policy.
func FuzzCheck(f *testing.F) {
	f.Add(int64(5), int64(4), true, 0)
	f.Add(int64(1), int64(0), false, 1)
	f.Add(int64(7), int64(0), false, 1)
	f.Add(int64(-1), int64(9223372036854775807), true, 0)
	f.Fuzz(func(t *testing.T, v, last int64, known bool, first int) {
		c := Config{First: FirstPolicy(first & 1)}.WithDefaults()
		r := c.Check(v, last, known)
		var want Outcome
		switch {
		case !known && (c.First == FirstAny || v == 1):
			want = Applied
		case !known:
			want = Gap
		case v <= last:
			want = Stale
		case v == last+1:
			want = Applied
		default:
			want = Gap
		}
		if r.Outcome != want || r.Version != v || r.First == known {
			t.Fatalf("Check(%d, %d, %v) = %+v, want %s", v, last, known, r, want)
		}
	})
}

// Config.Validate never panics, and what it accepts is within the
// documented values.
func FuzzConfigValidate(f *testing.F) {
	f.Add("version", 0, 0, int64(0))
	f.Add("", 3, -1, int64(-5))
	f.Add("v", 2, 1, int64(time.Hour))
	f.Fuzz(func(t *testing.T, header string, gaps, first int, timeout int64) {
		c := Config{Header: header, Gaps: GapPolicy(gaps), First: FirstPolicy(first), GapTimeout: time.Duration(timeout)}.WithDefaults()
		if err := c.Validate(); err != nil {
			return
		}
		if c.Gaps < Wait || c.Gaps > Accept || c.First < FirstAny || c.First > FirstMustBeOne || c.GapTimeout <= 0 || c.Header == "" {
			t.Fatalf("Validate accepted %+v", c)
		}
	})
}
