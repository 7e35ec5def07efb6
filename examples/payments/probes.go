package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
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

// checkProbes GETs the ledger consumer's /livez and /readyz at addr and
// prints what they answer; it fails unless both answer 200 within 10 s.
func checkProbes(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("the probes' address %q: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	base := "http://" + net.JoinHostPort(host, port)
	deadline := time.Now().Add(10 * time.Second)
	for _, path := range []string{"/livez", "/readyz"} {
		for {
			code, body, err := getProbe(ctx, base+path)
			if err == nil && code == http.StatusOK {
				fmt.Printf("  ledger consumer GET %s: %d %s\n", path, code, body)
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("the ledger consumer's GET %s answered %d %s (%v), want 200", path, code, body, err)
			}
			time.Sleep(100 * time.Millisecond) // polling a probe, as Kubernetes does
		}
	}
	return nil
}

// getProbe GETs a probe's url and returns its status code and body.
func getProbe(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}
