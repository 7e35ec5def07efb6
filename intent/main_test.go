package intent_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kscope-dev/kscope/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stopShared{m})
}

// stopShared stops the test PostgreSQL server after the tests, before
// goleak looks for leftover goroutines.
type stopShared struct{ m *testing.M }

func (s stopShared) Run() int {
	code := s.m.Run()
	testenv.StopShared()
	return code
}
