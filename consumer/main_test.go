package consumer_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kscope-dev/kscope/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(&mainWrapper{m})
}

// mainWrapper stops the shared test servers after the tests and before
// goleak looks for leftover goroutines.
type mainWrapper struct{ m *testing.M }

func (w *mainWrapper) Run() int {
	code := w.m.Run()
	testenv.StopShared()
	return code
}
