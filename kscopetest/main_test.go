package kscopetest_test

import (
	"testing"

	"github.com/kscope-dev/kscope/kscopetest"
)

func TestMain(m *testing.M) { kscopetest.Main(m) }
