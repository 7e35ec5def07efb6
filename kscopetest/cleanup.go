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

	"github.com/twmb/franz-go/pkg/kerr"

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

// removeKafka deletes, when t ends, the topics whose names are in topics or
// start with one of prefixes, and group. Errors are logged: what cannot be
// deleted is left, and the run is not failed for it.
func removeKafka(t testing.TB, k *testenv.Kafka, group string, topics []string, prefixes ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		adm := k.Admin()
		all, err := adm.ListTopics(ctx)
		if err != nil {
			t.Logf("kscopetest: listing topics to remove this scenario's: %v", err)
			return
		}
		want := map[string]bool{}
		for _, tp := range topics {
			want[tp] = true
		}
		var del []string
		for tp := range all {
			if want[tp] {
				del = append(del, tp)
				continue
			}
			for _, p := range prefixes {
				if strings.HasPrefix(tp, p) {
					del = append(del, tp)
					break
				}
			}
		}
		if len(del) > 0 {
			resps, err := adm.DeleteTopics(ctx, del...)
			if err == nil {
				err = resps.Error()
			}
			if err != nil {
				t.Logf("kscopetest: removing topics %v: %v", del, err)
			}
		}
		if group != "" {
			if _, err := adm.DeleteGroup(ctx, group); err != nil && !isNoGroup(err) {
				t.Logf("kscopetest: removing group %s: %v", group, err)
			}
		}
	})
}

func isNoGroup(err error) bool {
	return kerr.IsRetriable(err) || err == kerr.GroupIDNotFound || strings.Contains(err.Error(), kerr.GroupIDNotFound.Message)
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
