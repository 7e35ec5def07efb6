// Command observability runs an AtLeastOnce pipeline with kscope's
// Prometheus and OpenTelemetry hooks, serves /metrics and the Kubernetes
// probes /livez and /readyz (package health) while it runs, and
// prints what a scrape shows once the backlog is drained. Part of its input
// comes through a transactional outbox: a traced "book order" writes
// notifications in a PostgreSQL transaction, the relay publishes them (its
// metrics on the same /metrics), and the consumer's spans continue the
// writer's trace. alerts.yml holds Prometheus alert rules for kscope's
// metrics, pipelines.yml the consumer groups they watch (and which are
// critical), which you edit; dashboard.json a Grafana dashboard.
//
//	go run ./examples/observability
//	go run ./examples/observability -listen 127.0.0.1:9464 -hold 1m   # scrape it yourself
//
// It runs against KAFKA_BROKERS and DATABASE_URL when set, else against an
// in-process Kafka and a throwaway PostgreSQL (package devenv). Its topic,
// group and schema end in a suffix of their own per run (devenv.RunName),
// and it removes them when it ends, so that it runs again and again
// against the same servers; a service uses fixed names.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/devenv"
	"github.com/kscope-dev/kscope/health"
	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/kscopeotel"
	"github.com/kscope-dev/kscope/kscopeprom"
	"github.com/kscope-dev/kscope/retrytopic"
)

// The pipeline's topic (also the outbox's name) and group.
var (
	topic = devenv.RunName("notifications")
	group = devenv.RunName("notifier")
)

const (
	records = 300
	// outboxed notifications, written through the outbox by one traced
	// transaction
	outboxed = 20
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve /metrics on")
	hold := flag.Duration("hold", 0, "keep serving /metrics this long after the backlog is drained")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *listen, *hold, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

// Result is what one run observed.
type Result struct {
	Metrics  *kscopeprom.Metrics
	Spans    int
	Handled  int64
	Scrape   string // the kscope_ lines of the final /metrics scrape
	Endpoint string
	// Readyz is what GET /readyz answered once the backlog was drained:
	// the status code and the JSON report.
	Readyz string
	// OutboxTraced counts the consumer's spans in the trace of the
	// transaction that wrote the outbox rows.
	OutboxTraced int
}

func run(ctx context.Context, listen string, hold time.Duration, out *os.File) error {
	res, err := Run(ctx, listen, hold)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "served %s; %d records handled, %d spans recorded, %d of them continuing the outbox writer's trace\n", res.Endpoint, res.Handled, res.Spans, res.OutboxTraced)
	fmt.Fprintf(out, "GET /readyz: %s\n", res.Readyz)
	fmt.Fprint(out, res.Scrape)
	return nil
}

// Run produces a backlog with some poison and some flaky records, consumes
// it with both hooks, and scrapes /metrics once every record is done.
func Run(ctx context.Context, listen string, hold time.Duration) (*Result, error) {
	kafka, err := devenv.StartKafka(ctx)
	if err != nil {
		return nil, err
	}
	defer kafka.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, -1, nil, topic); err != nil {
		return nil, err
	}
	// Remove what this run created: the topic, the group and kscope's
	// topics for it, and the outbox relay's group and position topic.
	defer func() {
		ctx := context.WithoutCancel(ctx)
		kafka.Remove(ctx, group, topic)                                                //nolint:errcheck // best effort
		kafka.Remove(ctx, "kscope-outbox-"+topic, "kscope-outbox-"+topic+".positions") //nolint:errcheck // best effort
	}()
	if err := produceBacklog(ctx, cl); err != nil {
		return nil, err
	}

	// The two hooks: Prometheus metrics, and OpenTelemetry spans recorded
	// in memory.
	metrics, err := kscopeprom.New(kscopeprom.Options{})
	if err != nil {
		return nil, err
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.WithoutCancel(ctx)) //nolint:errcheck // in-memory
	tracer := kscopeotel.New(kscopeotel.Options{TracerProvider: tp})
	var handled atomic.Int64
	r, err := newPipeline(kafka.Brokers, []hook.Hook{metrics, tracer}, &handled)
	if err != nil {
		return nil, err
	}
	endpoint, stopServing, err := serveMetrics(listen, metrics, r)
	if err != nil {
		return nil, err
	}
	defer stopServing()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	traceID, stopOutbox, err := startOutbox(runCtx, kafka.Brokers, metrics, tp, tracer)
	defer stopOutbox()
	if err != nil {
		cancel()
		<-done
		return nil, err
	}
	waitDrained(ctx, r)
	scrape, readyz, err := scrapeDrained(ctx, endpoint)
	if err != nil {
		cancel()
		<-done
		return nil, err
	}
	if hold > 0 {
		fmt.Printf("serving %s for %s\n", endpoint, hold)
		select {
		case <-time.After(hold):
		case <-ctx.Done():
		}
	}
	cancel()
	if err := <-done; err != nil {
		return nil, err
	}
	return &Result{Metrics: metrics, Spans: len(spans.Ended()), Handled: handled.Load(), Scrape: scrape, Endpoint: endpoint,
		Readyz: readyz, OutboxTraced: continuing(spans, traceID)}, nil
}

// produceBacklog writes the notifications to send: every 50th is poison,
// every 30th fails once before it goes through.
func produceBacklog(ctx context.Context, cl *kgo.Client) error {
	var recs []*kgo.Record
	for i := range records {
		v := fmt.Sprintf("email-%04d", i)
		switch {
		case i%50 == 49:
			v = "poison"
		case i%30 == 29:
			v = "flaky-" + v
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("user-%02d", i%40)), Value: []byte(v)})
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// serveMetrics serves the metrics' /metrics, and r's Kubernetes probes
// /livez and /readyz, on listen, and returns the metrics' URL and the
// function that stops serving them.
func serveMetrics(listen string, metrics *kscopeprom.Metrics, r *consumer.Runner) (endpoint string, stop func(), err error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler())
	probes := health.New(r)
	mux.Handle("/livez", probes)
	mux.Handle("/readyz", probes)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // closed by stop
	return "http://" + ln.Addr().String() + "/metrics", func() { srv.Close() }, nil
}

// newPipeline returns the AtLeastOnce runner of the notifications, with
// the hooks: a poison record is dead-lettered, a flaky one fails once and
// is retried; handled counts the notifications sent.
func newPipeline(brokers []string, hooks []hook.Hook, handled *atomic.Int64) (*consumer.Runner, error) {
	var tries sync.Map // value -> *atomic.Int32
	return consumer.New(consumer.Config{
		Brokers:        brokers,
		Group:          group,
		Topics:         []string{topic},
		CommitInterval: 100 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		Hooks:          hooks,
		Failures:       retrytopic.Policy{Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond},
	}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
		v := string(rec.Value)
		if v == "poison" {
			return consumer.DecodeError(errors.New("not a notification"))
		}
		if strings.HasPrefix(v, "flaky-") {
			n, _ := tries.LoadOrStore(v, new(atomic.Int32))
			if n.(*atomic.Int32).Add(1) == 1 {
				return consumer.Retryable(errors.New("mail relay busy"))
			}
		}
		handled.Add(1)
		return nil
	}))
}

// waitDrained waits until every record is done (or a minute passes): the
// produced ones and the outboxed ones, then one more commit interval, so
// that the lag gauges show the drained state.
func waitDrained(ctx context.Context, r *consumer.Runner) {
	deadline := time.Now().Add(time.Minute)
	// (The relay's transaction markers take an offset each, so the
	// group's committed offsets stay one short of the end offsets.)
	for r.Stats().Done < records+outboxed && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond) // polling for the example's end, not synchronising workers
	}
	time.Sleep(300 * time.Millisecond)
}

// continuing counts the consumer's spans in the trace traceID of the
// transaction that wrote the outbox rows.
func continuing(spans *tracetest.SpanRecorder, traceID trace.TraceID) int {
	traced := 0
	for _, sp := range spans.Ended() {
		if sp.SpanContext().TraceID() == traceID && sp.Name() != "book order" {
			traced++
		}
	}
	return traced
}

func scrapeKscope(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "kscope_") && !strings.Contains(line, "_bucket{") {
			b.WriteString(line + "\n")
		}
	}
	return b.String(), sc.Err()
}

// scrapeDrained scrapes the kscope_ lines of /metrics at endpoint once
// the backlog is drained, and GETs /readyz beside it: the runner is ready
// then, and it answers 200.
func scrapeDrained(ctx context.Context, endpoint string) (scrape, readyz string, err error) {
	if scrape, err = scrapeKscope(ctx, endpoint); err != nil {
		return "", "", err
	}
	readyz, err = probe(ctx, strings.TrimSuffix(endpoint, "/metrics")+"/readyz")
	return scrape, readyz, err
}

// probe GETs a probe's url and returns its status code and body, in one
// line.
func probe(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, err = io.Copy(&b, resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(b.String())), err
}
