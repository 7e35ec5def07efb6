package kscopetest

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/kscope-dev/kscope/consumer"
)

// Faults is the kit's fault injector, as a scope's handler sees it (see
// [ScopePipeline].Runner): the handler runs its work through Call, so that
// the kit counts its calls per message id and makes the calls of the
// records a scenario picks fail, with a retryable, a non-retryable or an
// unclassified error, as the scenario needs.
type Faults struct {
	in       *injector
	idHeader string
}

// Call counts a call of the handler for r and returns the failure the
// scenario injects into this call, if any, without calling handle;
// otherwise it returns handle's error. A scope's handler returns what Call
// returns, unchanged, so that the scope routes the failure as it routes
// the service's own:
//
//	boltscope.HandlerFunc(func(ctx context.Context, tx *bolt.Tx, r *consumer.Record) error {
//		return f.Call(r, func() error { return svc.Handle(ctx, tx, r) })
//	})
func (f *Faults) Call(r *consumer.Record, handle func() error) error {
	err := f.in.before(r, f.idHeader)
	if err == nil {
		err = handle()
	}
	if err == nil {
		err = f.in.crash(r, f.idHeader)
	}
	f.in.after(r, f.idHeader, err)
	return err
}

// injector counts handler calls per message id and injects the failures a
// scenario asks for, before the pipeline's own handler runs.
type injector struct {
	// prefix starts every message id the scenario writes (see
	// kitIDPrefix); the counts and the scenario's failures are by the id
	// without it.
	prefix string
	mu     sync.Mutex
	calls  map[string]int
	failed map[string]bool // a call of the id returned an error (not a skip)
	ended  map[string]int  // calls of the id that returned
	fail   map[string]func(n int) error
	// crashAfter fails a call of the id after the handler returned nil,
	// before the scope commits (a share group's crash mid-transaction).
	crashAfter map[string]func(n int) error
	lastErr    error // the handler's last error (not a skip), for a failing scenario's report
}

func newInjector(prefix string) *injector {
	return &injector{prefix: prefix, calls: map[string]int{}, failed: map[string]bool{}, ended: map[string]int{}, fail: map[string]func(int) error{},
		crashAfter: map[string]func(int) error{}}
}

// after notes the outcome of a call of r.
func (in *injector) after(r *consumer.Record, idHeader string, err error) {
	id := in.idOf(r, idHeader)
	in.mu.Lock()
	defer in.mu.Unlock()
	in.ended[id]++
	if err == nil || consumer.ClassOf(err) == consumer.ClassSkip {
		return
	}
	in.failed[id] = true
	in.lastErr = err
}

// lastWords is the handler's last error for a report ("none" if none).
func (in *injector) lastWords() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.lastErr == nil {
		return "none"
	}
	return in.lastErr.Error()
}

// repeats returns the call counts of the ids handled more than once
// although none of their calls failed.
func (in *injector) repeats() map[string]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out map[string]int
	for id, n := range in.calls {
		if n > 1 && !in.failed[id] {
			if out == nil {
				out = map[string]int{}
			}
			out[id] = n
		}
	}
	return out
}

// repeatsDetail says which records were handled again.
func repeatsDetail(repeats map[string]int) string {
	ids := make([]string, 0, len(repeats))
	for id := range repeats {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%s (%d calls)", id, repeats[id])
	}
	return "the handler ran more than once for records none of whose calls failed: " + strings.Join(parts, ", ")
}

// before counts a call of r and returns the injected failure, if any.
func (in *injector) before(r *consumer.Record, idHeader string) error {
	id := in.idOf(r, idHeader)
	in.mu.Lock()
	in.calls[id]++
	n := in.calls[id]
	f := in.fail[id]
	in.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(n)
}

// unreached withdraws the call before counted for r: r was in a batch
// whose handler failed at an earlier record and never reached r.
func (in *injector) unreached(r *consumer.Record, idHeader string) {
	id := in.idOf(r, idHeader)
	in.mu.Lock()
	in.calls[id]--
	in.mu.Unlock()
}

// idOf returns r's message id, without the scenario's prefix.
func (in *injector) idOf(r *consumer.Record, idHeader string) string {
	id, _ := r.Header(idHeader)
	return strings.TrimPrefix(string(id), in.prefix)
}

// failOn makes calls of the record with this id return f(call number).
func (in *injector) failOn(id string, f func(n int) error) {
	in.mu.Lock()
	in.fail[id] = f
	in.mu.Unlock()
}

func (in *injector) callsOf(id string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.calls[id]
}

// total returns the handler calls counted so far, of every id.
func (in *injector) total() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := 0
	for _, c := range in.calls {
		n += c
	}
	return n
}
