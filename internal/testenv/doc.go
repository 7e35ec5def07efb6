// Package testenv provides the Kafka, PostgreSQL and Redis backends that
// kscope's tests, examples, demo and benchmarks run against, chosen in this
// order:
//
//	Kafka:      KAFKA_BROKERS if set → an in-process kfake cluster (default)
//	            → Apache Kafka started from its Maven Central artifacts on
//	            this machine's JDK when KSCOPE_KAFKA=apache (KRaft, loopback
//	            ports; one node, or a cluster of several through
//	            StartApacheKafka for tests that kill brokers)
//	            → testcontainers Kafka when KSCOPE_TEST_CONTAINERS=1
//	PostgreSQL: DATABASE_URL if set → a throwaway server started from the
//	            PostgreSQL binaries on this machine (initdb + pg_ctl in a
//	            temporary directory, on a free loopback port)
//	            → testcontainers Postgres when KSCOPE_TEST_CONTAINERS=1
//	Redis:      REDIS_URL if set → a throwaway redis-server (Debian's
//	            redis-server package) on a free loopback port, in a
//	            temporary directory, without persistence
//
// The Apache Kafka backend resolves the broker ([ApacheKafkaVersion]) and its
// runtime dependencies with Maven once, into KSCOPE_KAFKA_CACHE (by default
// kscope/kafka-<version> under the user's cache directory), formats a KRaft
// storage directory per node in a temporary directory, and starts kafka.Kafka
// with a generated server.properties. Every JVM it starts is in its own
// process group, killed by Close and, on Linux, by the kernel when the test
// process dies.
//
// The testcontainers path lives in the module kscopetest/containers, so that
// the library's go.mod does not pull testcontainers in; importing it plugs it
// in here through kscopetest.UseContainers and [UseContainers].
package testenv
