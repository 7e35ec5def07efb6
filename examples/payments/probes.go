package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/kscope-dev/kscope/health"
)

// probesEnv passes the -probes address to the ledger consumer child.
const probesEnv = "KSCOPE_DEMO_PROBES"

// probesAddr is the -probes flag: where the ledger consumer serves its
// Kubernetes probes, /livez and /readyz; empty (the default) serves none.
var probesAddr string

// serveProbes serves the runners' /livez and /readyz on addr until ctx
// ends; the probes are a plain http.Handler, so a service can as well
// mount them on the mux it already serves. It returns once it listens,
// and a function that waits for the server to stop.
func serveProbes(ctx context.Context, addr string, runners ...health.Runner) (wait func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving the probes on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: health.New(runners...), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "probes:", err)
		}
	}()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut) //nolint:errcheck // the process is stopping
	}()
	return func() { <-done }, nil
}
