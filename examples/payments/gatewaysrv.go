package main

import (
	"encoding/json"
	"net"
	"net/http"
	"sync"
)

// fakeGateway is the payment gateway the demo's consumers call, run by the
// demo itself so that it outlives them. Like many real ones, it does not
// deduplicate: every successful POST is a charge. It counts charges per
// idempotency key, so that a double charge shows.
type fakeGateway struct {
	URL string
	srv *http.Server

	mu         sync.Mutex
	attempts   map[string]int    // POSTs per key
	charges    map[string]int    // successful charges per key
	answers    map[string]string // "captured" or "declined", per key
	reconciled int               // lookups that found an answer
	sends      map[string]int    // notifications sent, per idempotency key
}

func startGateway() (*fakeGateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &fakeGateway{URL: "http://" + ln.Addr().String(),
		attempts: map[string]int{}, charges: map[string]int{}, answers: map[string]string{}, sends: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", g.charge)
	mux.HandleFunc("GET /charges/{key}", g.lookup)
	// The messaging provider the notifier sends through, on the same
	// server: it counts sends per idempotency key and answers lookups.
	mux.HandleFunc("POST /notify", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.sends[r.Header.Get("Idempotency-Key")]++
		w.Write([]byte("sent")) //nolint:errcheck
	})
	mux.HandleFunc("GET /notify/{key}", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.sends[r.PathValue("key")] == 0 {
			http.Error(w, "no such message", http.StatusNotFound)
			return
		}
		w.Write([]byte("sent")) //nolint:errcheck
	})
	g.srv = &http.Server{Handler: mux}
	go g.srv.Serve(ln) //nolint:errcheck // ends with Close
	return g, nil
}

func (g *fakeGateway) Close() { g.srv.Close() }

// charge answers a capture as its "gateway" field says: "ok" charges,
// "declined" declines, "flaky" fails twice with a 503, then charges.
func (g *fakeGateway) charge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var c Capture
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil || key == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.attempts[key]++
	switch {
	case c.Gateway == "flaky" && g.attempts[key] <= 2:
		http.Error(w, "service unavailable", http.StatusServiceUnavailable)
		return
	case c.Gateway == "declined":
		g.answers[key] = "declined"
	default:
		g.charges[key]++
		g.answers[key] = "captured"
	}
	w.Write([]byte(g.answers[key])) //nolint:errcheck
}

func (g *fakeGateway) lookup(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a, ok := g.answers[r.PathValue("key")]
	if !ok {
		http.Error(w, "no such charge", http.StatusNotFound)
		return
	}
	g.reconciled++
	w.Write([]byte(a)) //nolint:errcheck
}

// counts returns the charges, the keys charged more than once, and the
// lookups that found an answer.
func (g *fakeGateway) counts() (charges, duplicated, reconciled int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.charges {
		charges += n
		if n > 1 {
			duplicated++
		}
	}
	return charges, duplicated, g.reconciled
}

// notifyDuplicates counts the sends beyond the first for one idempotency
// key.
func (g *fakeGateway) notifyDuplicates() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, c := range g.sends {
		n += c - 1
	}
	return n
}
