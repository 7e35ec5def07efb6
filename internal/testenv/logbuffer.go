package testenv

import (
	"bytes"
	"log/slog"
	"sync"
)

// LogBuffer collects a runner's log lines for a test to read; it is safe
// for the runner's goroutines to write while the test reads.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Logger returns a text logger, at Debug and above, that writes to b.
func (b *LogBuffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
