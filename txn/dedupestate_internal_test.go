package txn

import (
	"slices"
	"testing"
	"time"
)

// The remembered identities of a partition: a transaction's identities
// count once it commits and are dropped when it aborts; identities past
// the window or beyond the maximum are forgotten oldest first, two at
// most for each identity remembered, and only once the transaction that
// forgets them commits.
func TestIDMemory(t *testing.T) {
	m := newIDMemory()
	t0 := time.UnixMilli(1_000_000)
	const window = time.Minute
	m.remember("a", t0, window, 3)
	if !m.seen("a", t0, window) {
		t.Fatal("a not seen in its own transaction")
	}
	m.end(false)
	if m.seen("a", t0, window) {
		t.Fatal("a seen after its transaction aborted")
	}
	for i, id := range []string{"a", "b", "c"} {
		if out := m.remember(id, t0.Add(time.Duration(i)*time.Second), window, 3); len(out) != 0 {
			t.Fatalf("remembering %s forgot %v; want nothing below the maximum", id, out)
		}
	}
	m.end(true)
	if out := m.remember("d", t0.Add(3*time.Second), window, 3); !slices.Equal(out, []string{"a"}) {
		t.Fatalf("a fourth identity beyond a maximum of 3 forgot %v; want the oldest, a", out)
	}
	if m.seen("a", t0.Add(3*time.Second), window) {
		t.Fatal("a seen while the open transaction forgets it")
	}
	m.end(false)
	if !m.seen("a", t0.Add(3*time.Second), window) {
		t.Fatal("a forgotten though the transaction that forgot it aborted")
	}
	later := t0.Add(window + 10*time.Second)
	if m.seen("b", later, window) {
		t.Fatal("b seen past its window")
	}
	if out := m.remember("e", later, window, 3); !slices.Equal(out, []string{"a", "b"}) {
		t.Fatalf("remembering past the window forgot %v; want a and b, two at most", out)
	}
	m.end(true)
	if m.seen("a", later, window) || m.seen("b", later, window) || !m.seen("e", later, window) {
		t.Fatal("after the commit: want a and b forgotten, e remembered")
	}
	if len(m.at) != 2 {
		t.Fatalf("%d identities kept; want c and e", len(m.at))
	}
}
