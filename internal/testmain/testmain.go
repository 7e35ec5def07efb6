// Package testmain is the TestMain of kscope's test packages: it runs the
// tests, stops the shared test servers, and checks that no goroutine is
// left over. It is a package of its own so that internal/testenv, which
// the kscopetest kit builds on, does not bring goleak to its users.
package testmain

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// Main runs a package's tests (TestMain calls it), stops the shared
// PostgreSQL server after them, and then, with goleak, fails the run if a
// goroutine is left over (opts are goleak's).
func Main(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(stopAfter{m}, opts...)
}

// stopAfter runs the tests, then stops the shared servers, before goleak
// looks for leftover goroutines.
type stopAfter struct{ m *testing.M }

func (s stopAfter) Run() int {
	code := s.m.Run()
	testenv.StopShared()
	return code
}
