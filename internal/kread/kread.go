// Package kread reads Kafka partitions up to given end offsets: the
// changelog restore of the Kafka scope, the outbox relay's positions, the
// CLI's reads and the tests' reads share it.
package kread

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Options tune ToEnd.
type Options struct {
	// Idle, when positive, bounds how long a poll may bring nothing for
	// an unfinished partition: ToEnd then returns an *IdleError.
	Idle time.Duration
	// Tolerate says which fetch errors, besides retriable ones and the
	// end of a poll's own deadline, the read goes on after.
	Tolerate func(error) bool
}

// IdleError says that a partition brought no record for Options.Idle
// before its end offset.
type IdleError struct {
	Topic     string
	Partition int32
	Offset    int64 // the next offset to read, -1 when none was read yet
	End       int64
	Idle      time.Duration
}

func (e *IdleError) Error() string {
	return fmt.Sprintf("reading %s partition %d: no record for %v at offset %d, before the end offset %d", e.Topic, e.Partition, e.Idle, e.Offset, e.End)
}

// ToEnd polls cl, which consumes the partitions of ends with read_committed
// isolation and kgo.KeepControlRecords, until each partition was read up
// to its end offset, and calls fn for every data record below it, in each
// partition's offset order. A partition is read once a record or a
// transaction marker at or past its last offset was seen: markers and
// aborted records take offsets without being data. Partitions with an end
// of 0 or less are not waited for. ToEnd returns ctx's error, fn's error, or
// a fetch error that is neither retriable nor tolerated.
func ToEnd(ctx context.Context, cl *kgo.Client, ends map[string]map[int32]int64, o Options, fn func(*kgo.Record) error) error {
	type tp struct {
		topic     string
		partition int32
	}
	left := map[tp]int64{}
	next := map[tp]int64{}
	for t, ps := range ends {
		for p, end := range ps {
			if end > 0 {
				left[tp{t, p}] = end
			}
		}
	}
	for len(left) > 0 {
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if o.Idle > 0 {
			pollCtx, cancel = context.WithTimeout(ctx, o.Idle)
		}
		fs := cl.PollFetches(pollCtx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		timedOut := false
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				timedOut = true
			case errors.Is(err, context.Canceled), kerr.IsRetriable(err):
			case o.Tolerate != nil && o.Tolerate(err):
			default:
				if ferr == nil {
					ferr = fmt.Errorf("reading %s partition %d: %w", t, p, err)
				}
			}
		})
		if ferr != nil {
			return ferr
		}
		progressed := false
		for r := range fs.RecordsAll() {
			k := tp{r.Topic, r.Partition}
			end, ok := left[k]
			if !ok {
				continue
			}
			if r.Offset >= end {
				delete(left, k) // past the end: nothing below it is left
				continue
			}
			if n, seen := next[k]; seen && r.Offset < n {
				continue // fetched again after a reset
			}
			next[k] = r.Offset + 1
			progressed = true
			if !r.Attrs.IsControl() {
				if err := fn(r); err != nil {
					return err
				}
			}
			if r.Offset >= end-1 {
				delete(left, k)
			}
		}
		if !progressed && timedOut {
			for k, end := range left {
				n, ok := next[k]
				if !ok {
					n = -1
				}
				return &IdleError{Topic: k.topic, Partition: k.partition, Offset: n, End: end, Idle: o.Idle}
			}
		}
	}
	return nil
}
