// Package integration holds kscope's end-to-end suites: real group members
// (some of them child processes that are killed), a Kafka protocol peer and,
// for the DB scope, a real PostgreSQL. They run on the in-process kfake
// cluster by default, on KAFKA_BROKERS when set, and on testcontainers when
// KSCOPE_TEST_CONTAINERS=1.
package integration

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kscope-dev/kscope/internal/testenv"
	// With KSCOPE_TEST_CONTAINERS=1 the suites run on containers.
	_ "github.com/kscope-dev/kscope/kscopetest/containers"
)

func TestMain(m *testing.M) {
	// A test binary started as a child consumer runs that and nothing else.
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(wrapped{m},
		// testcontainers keeps a reaper connection for the whole run.
		goleak.IgnoreTopFunction("github.com/testcontainers/testcontainers-go.(*Reaper).connect.func1"),
	)
}

type wrapped struct{ m *testing.M }

func (w wrapped) Run() int {
	code := w.m.Run()
	testenv.StopShared()
	if err := finishReliability(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	return code
}
