// Package exampleprobes serves the examples' Kubernetes probes, /livez
// and /readyz (the health package's handler), on the address in the
// KSCOPE_PROBES_ADDR environment variable, as a service serves them for
// its livenessProbe and readinessProbe:
//
//	KSCOPE_PROBES_ADDR=:8081 go run ./examples/quickstart -topic orders
//
// Unset (the default), an example serves no probes.
package exampleprobes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/kscope-dev/kscope/health"
)

// Env is the environment variable that names the probes' address (such
// as :8081); unset or empty, no probes are served.
const Env = "KSCOPE_PROBES_ADDR"

// Listening, when set, is called by Serve with the probes' base URL
// (http://host:port) once they listen: the examples' tests check them
// there, over HTTP, while a service-mode example runs.
var Listening func(baseURL string)

// BeforeStop, when set, is called by the stop function Serve returns with
// the probes' base URL (http://host:port), before the server shuts down:
// the examples' tests check there, over HTTP, that the probes answer while
// the runners still run. Examples call stop before they stop their
// runners.
var BeforeStop func(baseURL string)

// Serve serves the runners' /livez and /readyz on the address in $Env
// until stop is called (once; later calls do nothing), and says where on
// stderr. With $Env unset it
// serves nothing, and stop does nothing.
func Serve(runners ...health.Runner) (stop func(), err error) {
	addr := os.Getenv(Env)
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving the probes on %s (%s): %w", addr, Env, err)
	}
	mux := http.NewServeMux()
	probes := health.New(runners...)
	mux.Handle("/livez", probes)
	mux.Handle("/readyz", probes)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "probes:", err)
		}
	}()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(os.Stderr, "probes: %s/livez and %s/readyz\n", base, base)
	if Listening != nil {
		Listening(base)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if BeforeStop != nil {
				BeforeStop(base)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Shutdown(ctx) //nolint:errcheck // the example is stopping
			<-done
		})
	}, nil
}
