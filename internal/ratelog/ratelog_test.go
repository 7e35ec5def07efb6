package ratelog

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// 400 lines in a window log Burst of them; the next window starts with
// one line that counts the rest.
func TestLimiter(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	l := New(10, time.Hour)
	for range 400 {
		l.Log(context.Background(), log, slog.LevelError, "dead letter", "dead letters")
	}
	if n := strings.Count(buf.String(), "msg=\"dead letter\""); n != 10 {
		t.Fatalf("%d lines logged, want 10:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "later dead letters in this window are counted") {
		t.Fatalf("the last line of the burst does not say the rest are counted:\n%s", buf.String())
	}
	l.start = time.Now().Add(-2 * time.Hour) // the window passed
	buf.Reset()
	l.Log(context.Background(), log, slog.LevelError, "dead letter", "dead letters")
	if !strings.Contains(buf.String(), "not_logged=390") || strings.Count(buf.String(), "msg=\"dead letter\"") != 1 {
		t.Fatalf("next window:\n%s", buf.String())
	}
	// At a stop, what the window suppressed is counted too.
	for range 20 {
		l.Log(context.Background(), log, slog.LevelError, "dead letter", "dead letters")
	}
	buf.Reset()
	l.Flush()
	if !strings.Contains(buf.String(), "not_logged=11") {
		t.Fatalf("flush:\n%s", buf.String())
	}
}
