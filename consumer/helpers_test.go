package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("KSCOPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// runAsync runs r in a goroutine and returns a function that stops it and
// returns Run's error.
func runAsync(t testing.TB, r *consumer.Runner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(time.Minute):
				err = fmt.Errorf("Run did not return within a minute of cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func baseConfig(t testing.TB, k *testenv.Kafka, group string, topics ...string) consumer.Config {
	return consumer.Config{
		Brokers:        k.Brokers,
		Group:          group,
		Topics:         topics,
		CommitInterval: 50 * time.Millisecond,
		DrainTimeout:   5 * time.Second,
		Logger:         testLogger(t),
		GroupProtocol:  consumer.GroupProtocol(testenv.GroupProtocol()),
	}
}
