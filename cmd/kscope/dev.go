package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func devCmd() *command {
	return &command{
		name:    "dev",
		summary: "run a local Kafka-protocol broker (kfake) for development, no Docker",
		usage: `kscope dev [--port 9092] [--data-dir DIR] [--partitions N] [--nodes N] [--group-min-session-timeout D]

Runs franz-go's kfake, an in-process implementation of the Kafka protocol
(consumer groups, transactions, read_committed), on localhost until
interrupted. Any Kafka client can use it: point it at the printed address
(KAFKA_BROKERS=127.0.0.1:9092). Topics are created on first use. With
--data-dir the broker keeps its data across restarts; without it, everything
is gone when it stops. It is for development and tests, not production.

--port 0 picks free ports (printed). --nodes starts a cluster of that many
brokers on consecutive ports.

Examples:
  kscope dev
  kscope dev --port 19092 --data-dir ./.kafka --partitions 6
  kscope dev --port 0 --nodes 3 --group-min-session-timeout 100ms`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			port := fs.Int("port", 9092, "port of the first broker; the others take the next ones")
			dataDir := fs.String("data-dir", "", "keep the broker's data in this directory across restarts")
			partitions := fs.Int("partitions", 3, "partitions of topics created on first use")
			nodes := fs.Int("nodes", 1, "number of brokers in the cluster")
			minSession := fs.Duration("group-min-session-timeout", 6*time.Second,
				"the smallest session timeout a group member may ask for (Kafka's group.min.session.timeout.ms); "+
					"lower it so that a killed consumer's partitions move on sooner")
			return func(ctx context.Context) error {
				return dev(ctx, e, *port, *dataDir, *partitions, *nodes, *minSession)
			}
		},
	}
}

func dev(ctx context.Context, e *env, port int, dataDir string, partitions, brokers int, minSession time.Duration) error {
	if port < 0 || port > 65535-brokers {
		return usagef("--port %d is not a usable port", port)
	}
	if partitions < 1 || brokers < 1 {
		return usagef("--partitions and --nodes must be at least 1")
	}
	if minSession <= 0 {
		return usagef("--group-min-session-timeout must be positive, got %v", minSession)
	}
	ports := make([]int, brokers)
	for i := range ports {
		ports[i] = port + i
		if port == 0 {
			ports[i] = 0
		}
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(brokers),
		kfake.Ports(ports...),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(partitions),
		kfake.GroupMinSessionTimeout(minSession),
	}
	if dataDir != "" {
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return fmt.Errorf("creating --data-dir %s: %w", dataDir, err)
		}
		opts = append(opts, kfake.DataDir(dataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("starting the broker (is port %d free? pick another with --port): %w", port, err)
	}
	defer c.Close()
	addrs := c.ListenAddrs()
	fmt.Fprintf(e.stdout, "kscope dev: Kafka-protocol broker listening on %s\n", joinAddrs(addrs))
	fmt.Fprintf(e.stdout, "export KAFKA_BROKERS=%s\n", joinAddrs(addrs))
	if dataDir != "" {
		fmt.Fprintf(e.stdout, "data kept in %s\n", dataDir)
	}
	<-ctx.Done()
	fmt.Fprintln(e.stdout, "kscope dev: stopped")
	return nil
}

func joinAddrs(a []string) string {
	out := ""
	for i, s := range a {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}
