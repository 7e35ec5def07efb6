package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// The examples and the test kit as a user has them: each example copied
// into a Go module of the user's own, outside this repository (kscope
// required through a replace directive), builds and vets; so does a scope
// of the user's own, written in that module on the contract alone
// (package scope, run by consumer.NewScoped); the module's tests (the
// examples end to end, the kit on the examples' pipelines and on the
// user's scope) pass twice in a row against one shared broker and one
// shared PostgreSQL; and nothing they created is left on either: no topic,
// no group, no schema, no database.
func TestExamplesAndKitFromAUserModuleTwiceAgainstSharedServers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and runs its tests twice")
	}
	mod := userModule(t, "examples")
	goCmd(t, mod, nil, "build", "./...")
	goCmd(t, mod, nil, "vet", "./...")

	k := testenv.KafkaT(t)
	pg := testenv.SharedPostgres(t)
	env := []string{"KAFKA_BROKERS=" + strings.Join(k.Brokers, ","), "DATABASE_URL=" + pg.URL}
	before := userLeftovers(t, k, pg.URL)
	for run := 1; run <= 2; run++ {
		start := time.Now()
		out := goCmd(t, mod, env, "test", "-count=1", "-timeout=10m", "./...")
		t.Logf("run %d of the user module's tests against the shared servers (%v):\n%s", run, time.Since(start).Round(time.Second), out)
	}
	after := userLeftovers(t, k, pg.URL)
	for what, names := range after {
		for _, n := range names {
			if !slices.Contains(before[what], n) {
				t.Errorf("%s %s left behind by the user module's runs", what, n)
			}
		}
	}
}

// The kit's containers mode from a user's module: one import
// (kscopetest/containers, a module of its own) and KSCOPE_TEST_CONTAINERS=1.
// Without a Docker engine (none on kscope's CI machines) the kit's
// scenarios fail saying that the container could not start, which shows
// that the provider is linked in and asked; the containers themselves run
// under `make test-containers` on a machine with Docker.
func TestKitContainersModeFromAUserModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	mod := userModule(t, "containers")
	goCmd(t, mod, nil, "vet", "./...")
	if os.Getenv("KSCOPE_TEST_CONTAINERS") == "1" {
		t.Skip("the suites run on containers: the user module's kit test would too")
	}
	if _, err := os.Stat("/var/run/docker.sock"); err == nil {
		t.Skip("a Docker engine is reachable: make test-containers runs the kit on containers")
	}
	env := []string{"KSCOPE_TEST_CONTAINERS=1", "KAFKA_BROKERS=", "DATABASE_URL=", "KSCOPE_KAFKA="}
	cmd := exec.Command(goBin(), "test", "-count=1", "-timeout=5m", "./...")
	cmd.Dir = mod
	cmd.Env = append(goEnv(), env...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the kit passed in containers mode with no Docker engine:\n%s", out)
	}
	if strings.Contains(string(out), "no container provider is linked") {
		t.Fatalf("importing kscopetest/containers did not register the provider:\n%s", out)
	}
	if !strings.Contains(string(out), "is Docker running?") {
		t.Fatalf("the kit's failure does not say that the container could not start:\n%s", out)
	}
}

// userModule writes a Go module of a user's own in a temporary directory
// and returns its path: "examples" copies every example into it as a
// package of its own; "containers" holds a kit test that imports
// kscopetest/containers.
func userModule(t *testing.T, kind string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	mod := filepath.Join(t.TempDir(), "svc")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		t.Fatal(err)
	}
	gomod := "module example.com/svc\n\ngo 1.26.8\n\nrequire github.com/kscope-dev/kscope v0.0.0\n\n" +
		"replace github.com/kscope-dev/kscope => " + root + "\n"
	switch kind {
	case "examples":
		for _, ex := range exampleDirs(t) {
			copyDir(t, filepath.Join(root, "examples", ex), filepath.Join(mod, ex))
		}
		write(t, filepath.Join(mod, "ownscope", "ownscope.go"), ownScope)
		write(t, filepath.Join(mod, "ownscope", "ownscope_test.go"), ownScopeTest)
	case "containers":
		gomod += "\nrequire github.com/kscope-dev/kscope/kscopetest/containers v0.0.0\n\n" +
			"replace github.com/kscope-dev/kscope/kscopetest/containers => " + filepath.Join(root, "kscopetest", "containers") + "\n"
		write(t, filepath.Join(mod, "orders", "orders_test.go"), containersKitTest)
	}
	write(t, filepath.Join(mod, "go.mod"), gomod)
	// Start from the library's checksums; tidy adds what the module needs.
	var sums []byte
	for _, f := range []string{"go.sum", "kscopetest/containers/go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, b...)
	}
	write(t, filepath.Join(mod, "go.sum"), string(sums))
	goCmd(t, mod, nil, "mod", "tidy")
	return mod
}

const containersKitTest = `package orders

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/kscopetest"
	_ "github.com/kscope-dev/kscope/kscopetest/containers"
	"github.com/kscope-dev/kscope/txn"
)

func TestMain(m *testing.M) { kscopetest.Main(m) }

func TestOrdersPipeline(t *testing.T) {
	kscopetest.Kafka(t, kscopetest.KafkaPipeline{
		Handler: txn.HandlerFunc(func(_ context.Context, r *consumer.Record, out txn.Emitter) error {
			out.Emit(&kgo.Record{Topic: "orders.out", Value: r.Value})
			return nil
		}),
		OutputTopics: []string{"orders.out"}, OutputsPerInput: 1,
		Valid: func(i int) *kgo.Record { return &kgo.Record{Value: []byte("order")} },
	})
}
`

// ownScope is a scope of a user's own, in the user's module: its store is
// in memory (an inbox of identities and the orders applied, changed
// together under one lock), its failures go through the runner's engine.
// It uses kscope's public packages only; the assertions make a contract
// that cannot be implemented outside kscope a compile error here.
const ownScope = `// Package ownscope is a scope of the service's own, on kscope's contract.
package ownscope

import (
	"context"
	"sync"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/scope"
)

// Store is the service's state: the orders applied, and the inbox of the
// records that applied them.
type Store struct {
	mu     sync.Mutex
	inbox  map[string]bool
	orders []string
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{inbox: map[string]bool{}} }

// Orders returns how many orders were applied.
func (s *Store) Orders() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.orders)
}

// Handler returns the order a record applies.
type Handler func(ctx context.Context, r *consumer.Record) (order string, err error)

var (
	_ scope.Scope[*consumer.Record]      = (*memScope)(nil)
	_ scope.EngineUser[*consumer.Record] = (*memScope)(nil)
)

type memScope struct {
	store    *Store
	h        Handler
	identity consumer.Identity
	f        scope.Failures[*consumer.Record]
}

// New returns a runner that applies each record's order to store once.
func New(cfg consumer.Config, store *Store, h Handler) (*consumer.Runner, error) {
	s := &memScope{store: store, h: h}
	r, err := consumer.NewScoped(cfg, s)
	if err != nil {
		return nil, err
	}
	s.identity = r.Config().Identity
	return r, nil
}

func (s *memScope) UseEngine(e scope.Engine[*consumer.Record]) { s.f = e.Failures() }

func (s *memScope) Process(ctx context.Context, batch []*consumer.Record, done func(*consumer.Record)) {
	for _, r := range batch {
		id := s.identity.Of(r)
		a := s.f.Attempts(ctx, r, false, done, func() error { return s.apply(ctx, id, r) })
		if !a.OK {
			return // stopped or revoked: the record is delivered again
		}
		if a.Err != nil {
			if err := s.f.Route(ctx, r, a.Err, a.Step, a.N, a.First); err != nil {
				return
			}
		}
		done(r)
	}
}

// apply applies r's order and records id in the inbox, both or neither.
func (s *memScope) apply(ctx context.Context, id string, r *consumer.Record) error {
	s.store.mu.Lock()
	defer s.store.mu.Unlock()
	if s.store.inbox[id] {
		return nil
	}
	order, err := s.h(ctx, r)
	if err != nil {
		return err
	}
	s.store.inbox[id] = true
	s.store.orders = append(s.store.orders, order)
	return nil
}
`

// ownScopeTest runs the kit's delivery-semantics table on ownScope.
const ownScopeTest = `package ownscope_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/kscopetest"

	"example.com/svc/ownscope"
)

func TestMain(m *testing.M) { kscopetest.Main(m) }

func TestOwnScopeKeepsTheKitsGuarantees(t *testing.T) {
	rep := kscopetest.Scope(t, kscopetest.ScopePipeline[*ownscope.Store]{
		Open: func(*testing.T) *ownscope.Store { return ownscope.NewStore() },
		Runner: func(s *ownscope.Store, cfg consumer.Config, f *kscopetest.Faults) (*consumer.Runner, error) {
			return ownscope.New(cfg, s, func(_ context.Context, r *consumer.Record) (string, error) {
				var order struct{ ID string }
				err := f.Call(r, func() error {
					if err := json.Unmarshal(r.Value, &order); err != nil {
						return consumer.DecodeError(err)
					}
					return nil
				})
				return order.ID, err
			})
		},
		Valid:       func(i int) *kgo.Record { return &kgo.Record{Value: fmt.Appendf(nil, "{\"ID\":\"o-%d\"}", i)} },
		Undecodable: func() *kgo.Record { return &kgo.Record{Value: []byte("not json")} },
		Effects:     func(_ context.Context, s *ownscope.Store) (int, error) { return s.Orders(), nil },
	})
	for _, r := range rep {
		if !r.Held || r.Skipped {
			t.Errorf("%s: held %v, skipped %v: %s", r.Scenario, r.Held, r.Skipped, r.Detail)
		}
	}
	if len(rep) == 0 {
		t.Fatal("the kit ran no scenario")
	}
}
`

// exampleDirs lists the examples.
func exampleDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join("..", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	if len(out) < 6 {
		t.Fatalf("found examples %v, want the six", out)
	}
	return out
}

// copyDir copies an example's source and data files (not binaries).
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch filepath.Ext(e.Name()) {
		case ".go", ".yml", ".yaml", ".json", ".sql":
		default:
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(to, e.Name()), string(b))
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goBin is the go command that runs this test: $GOROOT/bin/go when the go
// command set GOROOT for it, else the one on PATH.
func goBin() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// goEnv is the environment of the go commands: this one's, outside any
// workspace, with no toolchain download.
func goEnv() []string {
	return append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
}

// goCmd runs the go command in dir and fails the test, with its output,
// when it fails.
func goCmd(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goBin(), args...)
	cmd.Dir = dir
	cmd.Env = append(goEnv(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in the user module: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// userLeftovers lists what exists on the shared servers: topics, groups,
// schemas and databases.
func userLeftovers(t *testing.T, k *testenv.Kafka, dbURL string) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string][]string{}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out["topic"] = topics.Names()
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out["group"] = groups.Groups()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for what, q := range map[string]string{
		"database": `SELECT datname FROM pg_database`,
		"schema":   `SELECT nspname FROM pg_namespace`,
	} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		out[what] = names
	}
	if len(out["topic"]) > 0 {
		t.Logf("topics on the shared broker: %s", fmt.Sprint(out["topic"]))
	}
	return out
}
