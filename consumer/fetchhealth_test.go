package consumer

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// A broker outage is logged when it starts, every 30s while it lasts and
// when it ends, not at every retry.
func TestFetchHealthLogsStateChanges(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var h fetchHealth
	down := errors.New("dial tcp 127.0.0.1:9092: connect: connection refused")
	for range 5 {
		h.failed(log, "", 0, down)
	}
	if n := strings.Count(buf.String(), "level=WARN"); n != 1 || !strings.Contains(buf.String(), "brokers or the group coordinator cannot be reached") {
		t.Fatalf("5 retries logged %d warnings, want 1 that names the brokers:\n%s", n, buf.String())
	}
	h.lastLog = h.lastLog.Add(-fetchHealthLogEvery) // 30s passed
	h.failed(log, "", 0, down)
	if !strings.Contains(buf.String(), "fetching still fails") || !strings.Contains(buf.String(), "errors=6") {
		t.Fatalf("no reminder after 30s:\n%s", buf.String())
	}
	h.ok(log)
	h.ok(log)
	if n := strings.Count(buf.String(), "fetching works again"); n != 1 {
		t.Fatalf("%d recovery lines, want 1:\n%s", n, buf.String())
	}
	if !h.since.IsZero() {
		t.Fatal("the state was not reset")
	}
}
