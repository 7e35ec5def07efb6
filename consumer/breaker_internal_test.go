package consumer

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

var errDep = errors.New("dependency down")

func testBreakers(failures int, window, openFor time.Duration) *breakers {
	return newBreakers(Config{Logger: slog.New(slog.DiscardHandler), Breakers: []BreakerConfig{{
		Name: "dep", Trips: func(err error) bool { return errors.Is(err, errDep) },
		Failures: failures, Window: window, OpenFor: openFor,
	}}})
}

// Failures older than Window do not count towards opening a breaker, and
// errors Trips does not match do not count at all.
func TestBreakerWindow(t *testing.T) {
	bs := testBreakers(2, 50*time.Millisecond, time.Hour)
	fail := func(err error) { bs.run(context.Background(), nil, func() error { return err }) } //nolint:errcheck // the breaker's state is what counts
	fail(errDep)
	fail(errors.New("another"))
	time.Sleep(60 * time.Millisecond) // the first failure leaves the window
	fail(errDep)
	if st := bs.states()[0]; st.State != BreakerClosed {
		t.Fatalf("breaker %+v after two failures 60ms apart with a 50ms window; want closed", st)
	}
	fail(errDep)
	if st := bs.states()[0]; st.State != BreakerOpen || st.Trips != 1 {
		t.Fatalf("breaker %+v after two failures within the window; want open, 1 trip", st)
	}
	if !bs.holds(errDep) || bs.holds(errors.New("another")) {
		t.Fatal("an open breaker holds its dependency's failures, and only those")
	}
}

// While open, a call waits until its context ends; half-open, one probe
// goes while the other calls wait; the probe's success closes the breaker
// and lets them go.
func TestBreakerProbe(t *testing.T) {
	bs := testBreakers(1, time.Minute, 20*time.Millisecond)
	bs.run(context.Background(), nil, func() error { return errDep }) //nolint:errcheck // opens it
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := bs.run(ctx, nil, func() error { t.Error("a call ran while the breaker was open"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose context ended while the breaker was open returned %v; want context.Canceled", err)
	}
	release := make(chan struct{})
	probing := make(chan struct{})
	probeDone := make(chan error, 1)
	go func() {
		probeDone <- bs.run(context.Background(), nil, func() error { close(probing); <-release; return nil })
	}()
	<-probing // the breaker turned half-open: this call is its probe
	other := make(chan struct{})
	go func() {
		bs.run(context.Background(), nil, func() error { close(other); return nil }) //nolint:errcheck // waits for the probe
	}()
	select {
	case <-other:
		t.Fatal("a second call went while the half-open breaker's probe was out")
	case <-time.After(50 * time.Millisecond): // a second call that went would have by now
	}
	if st := bs.states()[0]; st.State != BreakerHalfOpen {
		t.Fatalf("breaker %+v while its probe is out; want half-open", st)
	}
	close(release)
	if err := <-probeDone; err != nil {
		t.Fatal(err)
	}
	<-other
	if st := bs.states()[0]; st.State != BreakerClosed || st.Trips != 1 {
		t.Fatalf("breaker %+v after its probe succeeded; want closed, 1 trip", st)
	}
}
