package health_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/health"
)

// Serve a runner's probes beside its Run: Kubernetes' livenessProbe gets
// /livez and its readinessProbe /readyz, on port 8081.
func Example() {
	r, err := consumer.New(consumer.Config{
		Brokers: []string{"kafka.internal:9092"},
		Group:   "payments",
		Topics:  []string{"payments.captured"},
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error { return nil }))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	probes := health.New(r) // more runners of the process may follow: health.New(r, audit, ...)
	mux.Handle("/livez", probes)
	mux.Handle("/readyz", probes)
	srv := &http.Server{Addr: ":8081", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.ListenAndServe() //nolint:errcheck // ends with srv.Close
	defer srv.Close()
	if err := r.Run(context.Background()); err != nil {
		log.Print(err) // /livez answered 503 once Run returned it
	}
}
