// Package containers runs kscope's backends in Docker containers through
// testcontainers-go: real Apache Kafka and PostgreSQL. It is the documented
// way to run the integration suites against real brokers on a machine with
// Docker:
//
//	KSCOPE_TEST_CONTAINERS=1 make test-containers
//
// It lives in the integration module so that the kscope library's go.mod
// does not make every user download testcontainers.
package containers

import (
	"context"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// Images used for the containers. Apache Kafka in KRaft mode (no ZooKeeper),
// and the PostgreSQL major version the local backend uses.
const (
	KafkaImage    = "apache/kafka:3.9.1"
	PostgresImage = "postgres:15-alpine"
)

// Provider implements testenv.Containers with testcontainers.
type Provider struct{}

var _ testenv.Containers = Provider{}

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
