// Package testenv provides the Kafka and PostgreSQL backends that kscope's
// tests, examples, demo and benchmarks run against, chosen in this order:
//
//	Kafka:      KAFKA_BROKERS if set → an in-process kfake cluster (default)
//	            → testcontainers Kafka when KSCOPE_TEST_CONTAINERS=1
//	PostgreSQL: DATABASE_URL if set → a throwaway server started from the
//	            PostgreSQL binaries on this machine (initdb + pg_ctl in a
//	            temporary directory, on a free loopback port)
//	            → testcontainers Postgres when KSCOPE_TEST_CONTAINERS=1
//
// The testcontainers path lives in the integration module, so that the
// library's go.mod does not pull testcontainers in; it plugs in here through
// [UseContainers].
package testenv
