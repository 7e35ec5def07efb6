package dedupe_test

import (
	"testing"

	"github.com/kscope-dev/kscope/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Main(m) }
