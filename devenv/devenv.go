// Package devenv gives kscope's examples, and a service run on a developer's
// machine, a Kafka cluster and a PostgreSQL server to run against:
//
//   - Kafka: the brokers KAFKA_BROKERS names (comma-separated), else an
//     in-process cluster (franz-go's kfake) that lives as long as the
//     process; KSCOPE_KAFKA=apache starts Apache Kafka instead, from its
//     Maven Central artifacts on the machine's JDK.
//   - PostgreSQL: the server DATABASE_URL names, else a throwaway server
//     started from the machine's PostgreSQL binaries (Debian: apt-get
//     install postgresql) in a temporary directory, on a free loopback port.
//
// Close stops and removes what was started (nothing for servers the
// environment names). [RunName] and [Postgres.Schema] keep the names of one
// run apart from another's on shared servers, so that an example runs again
// and again against the same `kscope dev` and database.
//
// devenv is for examples and local runs; production code takes its brokers
// and database URL from its own configuration.
package devenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Kafka is a Kafka cluster to run against.
type Kafka struct {
	// Brokers are the bootstrap brokers.
	Brokers []string
	// Kind says which cluster it is: "external" (KAFKA_BROKERS), "kfake"
	// (in-process), "apache" or "container".
	Kind string

	k *testenv.Kafka
}

// StartKafka returns the cluster KAFKA_BROKERS names, or starts one for
// this process as the package documentation says.
func StartKafka(ctx context.Context) (*Kafka, error) {
	k, err := testenv.StartKafka(ctx)
	if err != nil {
		return nil, err
	}
	return &Kafka{Brokers: k.Brokers, Kind: k.Kind, k: k}, nil
}

// Close stops a cluster StartKafka started; idempotent.
func (k *Kafka) Close() { k.k.Close() }

// Remove deletes topics, the consumer group group and the topics kscope
// created for it (its dead-letter, retry and version topics, named
// "<group>.kscope-…"): what a run created, when it ends. A group that does
// not exist is not an error.
func (k *Kafka) Remove(ctx context.Context, group string, topics ...string) error {
	return k.k.Remove(ctx, group, topics, retrytopic.SafeName(group)+".kscope-")
}

// Postgres is a PostgreSQL server to run against.
type Postgres struct {
	// URL connects to the server: DATABASE_URL as given, or the throwaway
	// server's "postgres" database as a superuser.
	URL string
	// Kind says which server it is: "external" (DATABASE_URL), "local"
	// (throwaway) or "container".
	Kind string

	p *testenv.Postgres
}

// StartPostgres returns the server DATABASE_URL names, or starts a
// throwaway one as the package documentation says.
func StartPostgres(ctx context.Context) (*Postgres, error) {
	p, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return nil, err
	}
	return &Postgres{URL: p.URL, Kind: p.Kind, p: p}, nil
}

// Close stops and removes a server StartPostgres started (its process and
// its data directory); idempotent.
func (p *Postgres) Close() { p.p.Close() }

// Schema creates schema name in the database of p.URL and returns a URL
// whose connections use it (search_path), and a function that drops it with
// everything in it. Tables created without a schema, kscope's included
// (dbscope.Migrate, outbox.Migrate), land in it, so that runs with
// different names never see each other's rows. The role needs the CREATE
// privilege on the database (its owner has it).
func (p *Postgres) Schema(ctx context.Context, name string) (schemaURL string, drop func(context.Context) error, err error) {
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return "", nil, fmt.Errorf("devenv: connecting to PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
		return "", nil, fmt.Errorf("devenv: creating schema %s (the role needs CREATE on the database): %w", name, err)
	}
	u, err := withSearchPath(p.URL, name)
	if err != nil {
		return "", nil, err
	}
	drop = func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE")
		return err
	}
	return u, drop, nil
}

// withSearchPath adds search_path=schema to a connection URL or keyword/value
// connection string.
func withSearchPath(conn, schema string) (string, error) {
	if !strings.Contains(conn, "://") {
		return conn + " search_path=" + schema, nil
	}
	u, err := url.Parse(conn)
	if err != nil {
		return "", fmt.Errorf("devenv: DATABASE_URL is not a URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// RunID is random per process: [RunName] appends it.
var RunID = func() string {
	var b [4]byte
	rand.Read(b[:]) //nolint:errcheck // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}()

// RunName returns name with this process's RunID appended ("orders" →
// "orders_1f2e3d4c"), a valid topic, group and PostgreSQL identifier when
// name is one: an example's topics, groups and schema get names of their
// own on every run, so that runs against shared servers never collide.
func RunName(name string) string { return name + "_" + RunID }
