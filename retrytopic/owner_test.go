package retrytopic_test

import (
	"strings"
	"testing"

	. "github.com/kscope-dev/kscope/retrytopic"
)

// The owner round-trips through the headers, replaces the one a record
// carried, is cut to MaxOwnerLength, and is left out when empty.
func TestOwnerHeader(t *testing.T) {
	r := rec(HeaderOwner, "someone else")
	m, err := FromRecord(r, idOf(r))
	if err != nil || m.Owner != "someone else" {
		t.Fatalf("owner %q, err %v", m.Owner, err)
	}
	m.Owner = "payments <#payments-oncall>"
	r.Headers = m.Headers(r.Headers, false)
	n := 0
	for _, h := range r.Headers {
		if h.Key == HeaderOwner {
			n++
		}
	}
	if got, _ := FromRecord(r, ""); n != 1 || got.Owner != "payments <#payments-oncall>" {
		t.Fatalf("%d owner headers, owner %q", n, got.Owner)
	}
	m.Owner = strings.Repeat("é", MaxOwnerLength)
	if got, _ := FromRecord(rec(), ""); got.Owner != "" {
		t.Fatalf("a record without the header has owner %q", got.Owner)
	}
	long := rec()
	long.Headers = m.Headers(nil, false)
	if got, _ := FromRecord(long, ""); len(got.Owner) > MaxOwnerLength || !strings.HasPrefix(got.Owner, "éé") {
		t.Fatalf("a long owner is %d bytes: %q", len(got.Owner), got.Owner)
	}
	m.Owner = ""
	for _, h := range m.Headers(nil, false) {
		if h.Key == HeaderOwner {
			t.Fatal("an empty owner written as a header")
		}
	}
}
