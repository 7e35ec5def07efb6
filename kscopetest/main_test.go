package kscopetest_test

import (
	"os"
	"testing"

	"github.com/kscope-dev/kscope/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopShared()
	os.Exit(code)
}
