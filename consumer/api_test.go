package consumer_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The package's exported names are what a service calls or implements:
// configuration, handlers, failure classes, hooks, stats and the runner.
// The contract a scope plugs into the runner with lives in package scope;
// a name added here is a promise to every user.
func TestExportedNamesAreTheUsersAPI(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/kscope-dev/kscope/consumer")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range p.Funcs {
		got = append(got, f.Name)
	}
	for _, ty := range p.Types {
		got = append(got, ty.Name)
		for _, f := range ty.Funcs {
			got = append(got, f.Name)
		}
		for _, m := range ty.Methods {
			got = append(got, ty.Name+"."+m.Name)
		}
	}
	slices.Sort(got)
	want := []string{
		"Class", "ClassOf", "Config", "GroupProtocol", "Config.WithDefaults", "ConfigError", "ConfigError.Error", "DBStats", "DedupeConfig", "DedupeStats", "DedupeUnavailable", "DedupeUnavailable.String", "DecodeError",
		"FailureStats", "Handler", "HandlerFunc", "HandlerFunc.Handle", "Health", "HoldStats",
		"Identity", "Identity.Append", "Identity.Of", "KafkaStats", "KeyBreakerConfig", "KeyBreakerStats", "Lateness", "New", "NewScoped", "NullKeyPolicy", "Record",
		"Record.Header", "Record.Revoked", "Retryable", "Runner", "Runner.Client",
		"CheckRoutes", "NewRouter", "RouteChecker", "Router", "Router.CheckRoutes", "Router.Default", "Router.Handle",
		"Router.Header", "Router.Pattern", "Router.Topic",
		"Runner.Close", "Runner.Config", "Runner.Health", "Runner.Run", "Runner.Stats", "ShareConfig", "ShareStart", "ShareStart.String", "ShareStats", "Skip", "Stats", "Terminal",
		"BatchError", "BatchError.Error", "BatchError.Unwrap", "BatchHandler", "BatchHandlerFunc",
		"BatchHandlerFunc.HandleBatch", "FailedAt", "FailedIndex", "NewBatch",
		"DecodeValue", "Decoder", "Encoder", "Typed",
		"Chain", "ExpiredAction", "ExpiredAction.String", "Middleware", "Recover", "Timeout",
		"All", "Partition", "PauseFor", "PauseFrom", "PauseOption", "PauseReason", "PauseTopic", "PausedTarget",
		"PersistPause", "Runner.Pause", "Runner.Paused", "Runner.Resume", "Target", "Target.String", "Topic",
		"Rate", "RateLimit", "RateStats",
		"IdleConfig", "PeriodicConfig", "PeriodicStats",
		"BreakerConfig", "BreakerState", "BreakerStatus", "BreakerStatus.String",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("exported names changed:\n got %v\nwant %v", got, want)
	}
}
