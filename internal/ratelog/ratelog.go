// Package ratelog bounds how many lines of one kind a runner logs: the
// first Burst lines of every Window are logged one by one, the rest are
// counted and reported in one line when the next window opens. Every
// scope logs its dead letters through one, so that 400 poison records
// make a handful of ERROR lines, not 400.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter decides, line by line, what is logged.
type Limiter struct {
	Burst  int           // lines logged one by one per window
	Window time.Duration // the window

	mu         sync.Mutex
	start      time.Time
	n          int
	suppressed int
	last       func() // logs the count of suppressed lines (set by Log)
}

// New returns a Limiter of burst lines per window.
func New(burst int, window time.Duration) *Limiter {
	return &Limiter{Burst: burst, Window: window}
}

// Log logs msg with attrs at level unless the window's burst is spent
// (then it is counted). When a new window opens after lines were
// suppressed, it first logs one line that says how many, with what.
func (l *Limiter) Log(ctx context.Context, log *slog.Logger, level slog.Level, msg, what string, attrs ...slog.Attr) {
	now := time.Now()
	l.mu.Lock()
	l.last = func() {
		log.LogAttrs(context.WithoutCancel(ctx), level, "kscope: more "+what+" than logged one by one",
			slog.Int("not_logged", l.suppressed), slog.Duration("window", l.Window), slog.Int("logged_per_window", l.Burst))
	}
	if l.start.IsZero() || now.Sub(l.start) >= l.Window {
		if l.suppressed > 0 {
			l.last()
		}
		l.start, l.n, l.suppressed = now, 0, 0
	}
	if l.n >= l.Burst {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.n++
	last := l.n == l.Burst
	l.mu.Unlock()
	if last {
		attrs = append(attrs, slog.String("note", "later "+what+" in this window are counted, not logged one by one; the metrics and the DLT have each of them"))
	}
	log.LogAttrs(ctx, level, msg, attrs...)
}

// Flush logs the count of the lines suppressed in the current window, if
// any: a runner calls it as it stops.
func (l *Limiter) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.suppressed > 0 && l.last != nil {
		l.last()
		l.suppressed = 0
	}
}
