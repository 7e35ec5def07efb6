package testenv

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

func TestDatabasesAreSeparate(t *testing.T) {
	ctx := context.Background()
	a, b := DatabaseT(t), DatabaseT(t)
	if a == b {
		t.Fatal("two calls returned one database")
	}
	for _, u := range []string{a, b} {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "CREATE TABLE only_here (id int)"); err != nil {
			t.Fatalf("%s: %v", redact(u), err)
		}
		conn.Close(ctx)
	}
}

func TestNoPostgresErrorNamesTheThreeWays(t *testing.T) {
	for _, want := range []string{"DATABASE_URL", "apt-get install postgresql", "KSCOPE_TEST_CONTAINERS=1"} {
		if !strings.Contains(ErrNoPostgres.Error(), want) {
			t.Fatalf("ErrNoPostgres does not mention %s: %v", want, ErrNoPostgres)
		}
	}
}

func TestKafkaBackend(t *testing.T) {
	ctx := context.Background()
	k := KafkaT(t)
	if err := k.CreateTopic(ctx, "t", 3); err != nil {
		t.Fatal(err)
	}
	k.ProduceKeyed(t, "t", 3, 2)
	ends, err := k.EndOffsets(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ends {
		n += e
	}
	if len(ends) != 3 || n != 6 {
		t.Fatalf("end offsets %v, want 6 records over 3 partitions", ends)
	}
	if k.Kind == "kfake" {
		if _, err := k.Fault(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRedactHidesPassword(t *testing.T) {
	if got := redact("postgres://u:secret@h:5432/db"); strings.Contains(got, "secret") {
		t.Fatalf("redact left the password: %s", got)
	}
}
