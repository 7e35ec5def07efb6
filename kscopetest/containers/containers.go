// Package containers runs the kscopetest kit, and kscope's own integration
// suites, on Apache Kafka and PostgreSQL in Docker containers through
// testcontainers-go. Import it in a test file of the service's module and
// set KSCOPE_TEST_CONTAINERS=1:
//
//	import _ "github.com/kscope-dev/kscope/kscopetest/containers"
//
//	KSCOPE_TEST_CONTAINERS=1 go test ./...
//
// It is a Go module of its own, so that the kscope library's go.mod does not
// make every user download testcontainers and the Docker client: only the
// modules that import it do. Without KSCOPE_TEST_CONTAINERS=1 importing it
// changes nothing (the kit uses KAFKA_BROKERS / DATABASE_URL, or starts
// in-process backends).
package containers

import (
	"context"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/kscope-dev/kscope/kscopetest"
)

func init() { kscopetest.UseContainers(Provider{}) }

// Images used for the containers. Apache Kafka in KRaft mode (no ZooKeeper),
// and the PostgreSQL major version the local backend uses.
const (
	KafkaImage    = "apache/kafka:3.9.1"
	PostgresImage = "postgres:15-alpine"
)

// Provider implements kscopetest.Containers with testcontainers; importing
// the package registers it.
type Provider struct{}

var _ kscopetest.Containers = Provider{}

// Kafka starts a single-node Apache Kafka container.
func (Provider) Kafka(ctx context.Context) ([]string, func(), error) {
	c, err := tckafka.Run(ctx, KafkaImage, tckafka.WithClusterID("kscope-test"))
	if err != nil {
		return nil, nil, fmt.Errorf("containers: starting %s (is Docker running?): %w", KafkaImage, err)
	}
	brokers, err := c.Brokers(ctx)
	if err != nil {
		testcontainers.TerminateContainer(c) //nolint:errcheck // already failing
		return nil, nil, err
	}
	return brokers, func() { testcontainers.TerminateContainer(c) }, nil //nolint:errcheck // cleanup
}

// Postgres starts a PostgreSQL container and returns a superuser URL.
func (Provider) Postgres(ctx context.Context) (string, func(), error) {
	c, err := tcpostgres.Run(ctx, PostgresImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("kscope"),
		tcpostgres.WithPassword("kscope"),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").WithOccurrence(2)),
	)
	if err != nil {
		return "", nil, fmt.Errorf("containers: starting %s (is Docker running?): %w", PostgresImage, err)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		testcontainers.TerminateContainer(c) //nolint:errcheck // already failing
		return "", nil, err
	}
	return u, func() { testcontainers.TerminateContainer(c) }, nil //nolint:errcheck // cleanup
}
