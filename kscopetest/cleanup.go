package kscopetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// runID tells this test binary's topics, groups and transactional ids from
// those of another run against the same broker.
var runID = func() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	}
	return hex.EncodeToString(b[:])
}()

// name returns the run's name for a scenario's topic or group.
func name(parts ...string) string {
	return "kt-" + strings.Join(parts, "-") + "-" + runID
}

// Main runs the tests of m and then stops what the kit started for them: the
// PostgreSQL server it starts when DATABASE_URL is unset (its process and
// its data directory). Call it from the service's TestMain:
//
//	func TestMain(m *testing.M) { kscopetest.Main(m) }
//
// It stops the server too when the test binary is interrupted (SIGINT,
// SIGTERM). Each scenario removes what it created on the broker (its
// topics, its group) and on the server (its database) when it ends, so that
// runs against a shared broker or DATABASE_URL leave nothing behind.
func Main(m *testing.M) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		if _, ok := <-sig; ok {
			testenv.StopShared()
			os.Exit(130)
		}
	}()
	code := m.Run()
	signal.Stop(sig)
	close(sig)
	testenv.StopShared()
	os.Exit(code)
}

// Containers starts the kit's backends in containers when
// KSCOPE_TEST_CONTAINERS=1. The module
// github.com/kscope-dev/kscope/kscopetest/containers provides one backed by
// testcontainers-go and registers it when imported; a service needs no
// other.
type Containers interface {
	// Kafka starts a Kafka cluster and returns its bootstrap brokers and
	// the function that removes it.
	Kafka(ctx context.Context) (brokers []string, stop func(), err error)
	// Postgres starts a PostgreSQL server and returns a superuser URL and
	// the function that removes it.
	Postgres(ctx context.Context) (url string, stop func(), err error)
}

// UseContainers registers c as the kit's container provider. With
// KSCOPE_TEST_CONTAINERS=1 the kit (and Main's cleanup) uses it for every
// backend that KAFKA_BROKERS or DATABASE_URL does not name.
func UseContainers(c Containers) { testenv.UseContainers(c) }

// removeKafka deletes, when t ends, the topics whose names are in topics or
// start with one of prefixes, and group. Errors are logged: what cannot be
// deleted is left, and the run is not failed for it.
func removeKafka(t testing.TB, k *testenv.Kafka, group string, topics []string, prefixes ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := k.Remove(ctx, group, topics, prefixes...); err != nil {
			t.Logf("kscopetest: removing this scenario's topics and group: %v", err)
		}
	})
}

// database returns a fresh database for t, dropped when t ends.
func database(t testing.TB) string {
	url := testenv.DatabaseT(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := testenv.DropDatabase(ctx, url); err != nil {
			t.Logf("kscopetest: dropping the scenario's database: %v", err)
		}
	})
	return url
}
