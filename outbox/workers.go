package outbox

import (
	"context"
	"sync"
)

// The publishers of the partitions a relay owns: starting, stopping and
// failing them.

// workers are the publishers of the partitions a relay owns now.
type workers struct {
	r     *Relay
	mu    sync.Mutex
	run   map[int]*publisher
	wg    sync.WaitGroup
	fatal func() error
	err   error
	// failed is closed when a publisher failed for good (err), so that
	// Run returns at once.
	failed chan struct{}
}

func newWorkers(r *Relay) *workers {
	w := &workers{r: r, run: map[int]*publisher{}, failed: make(chan struct{})}
	w.fatal = func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.err
	}
	return w
}

// start starts publishing partition p.
func (w *workers) start(ctx context.Context, p int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.run[p] != nil {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	pub := &publisher{r: w.r, p: p, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	pub.pos.Store(-1)
	w.run[p] = pub
	w.r.wakeMu.Lock()
	w.r.wake[p] = pub.wake
	w.r.pubs[p] = pub
	w.r.wakeMu.Unlock()
	w.r.owned.Add(1)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(pub.done)
		if err := pub.publish(pctx); err != nil && pctx.Err() == nil {
			w.fail(err)
		}
	}()
}

// fail fails the relay with err, unless it failed already: Run returns
// the first error.
func (w *workers) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		close(w.failed)
	}
}

// stop stops publishing partition p and waits until its open transaction
// ended.
func (w *workers) stop(p int) {
	w.mu.Lock()
	pub := w.run[p]
	delete(w.run, p)
	w.mu.Unlock()
	if pub == nil {
		return
	}
	pub.cancel()
	<-pub.done
	w.r.wakeMu.Lock()
	delete(w.r.wake, p)
	delete(w.r.pubs, p)
	w.r.wakeMu.Unlock()
	w.r.owned.Add(-1)
}

func (w *workers) stopAll() {
	w.mu.Lock()
	ps := make([]int, 0, len(w.run))
	for p := range w.run {
		ps = append(ps, p)
	}
	w.mu.Unlock()
	for _, p := range ps {
		w.stop(p)
	}
	w.wg.Wait()
}
