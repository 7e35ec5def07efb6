package consumer

import (
	"errors"
	"log/slog"
	"sync"

	"github.com/kscope-dev/kscope/internal/guard"
)

// maxPanicStacks bounds the identities panicStacks remembers; past it, it
// forgets them all, and a record that panics again has its stack logged
// again.
const maxPanicStacks = 4096

// panicStacks remembers the records (by identity) whose handler panic's
// stack was logged, so that a handler that panics on every attempt of a
// record has its stack logged once, on the record's first panic, and the
// log lines of its later attempts carry the panic's value alone. The zero
// value is ready to use.
type panicStacks struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// attrs returns the "stack" attribute of the panic err holds, the first
// time it is asked for the record of identity id; nil after that, and
// when err holds no panic.
func (p *panicStacks) attrs(id string, err error) []slog.Attr {
	var pe *guard.PanicError
	if !errors.As(err, &pe) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.seen[id]; ok {
		return nil
	}
	if p.seen == nil || len(p.seen) >= maxPanicStacks {
		p.seen = make(map[string]struct{})
	}
	p.seen[id] = struct{}{}
	return []slog.Attr{slog.String("stack", string(pe.Stack))}
}

// forget forgets the record of identity id: it is done with for good
// (dead-lettered, skipped), and a redrive of it that panics again has its
// stack logged again.
func (p *panicStacks) forget(id string) {
	p.mu.Lock()
	delete(p.seen, id)
	p.mu.Unlock()
}

// PanicStack implements scope.Failures.
func (f *failures) PanicStack(rec *Record, err error) []slog.Attr {
	return f.stacks.attrs(f.identity.Of(rec), err)
}
