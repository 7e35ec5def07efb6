package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kscope-dev/kscope/internal/testenv"
)

func devCmd() *command {
	return &command{
		name:    "dev",
		summary: "run a local Kafka-protocol broker (kfake) and a throwaway PostgreSQL for development, no Docker",
		usage: `kscope dev [--port 9092] [--data-dir DIR] [--partitions N] [--nodes N] [--group-min-session-timeout D]
           [--postgres auto|on|off] [--pg-port N] [--pg-bin DIR]

Runs franz-go's kfake, an in-process implementation of the Kafka protocol
(consumer groups, transactions, read_committed), on localhost until
interrupted. Any Kafka client can use it: point it at the printed address
(KAFKA_BROKERS=127.0.0.1:9092). Topics are created on first use. With
--data-dir the broker keeps its data across restarts; without it, everything
is gone when it stops. It is for development and tests, not production.

--port 0 picks free ports (printed). --nodes starts a cluster of that many
brokers on consecutive ports.

It also starts a throwaway PostgreSQL server, for the DB scope and the
outbox, from the PostgreSQL server binaries on the machine (initdb and
pg_ctl: on PATH, in /usr/lib/postgresql/<version>/bin, or in --pg-bin), in
a temporary directory, on 127.0.0.1 (--pg-port, a free port by default),
with a superuser "kscope" that needs no password; as root, the server runs
as the postgres user. It prints the URL (DATABASE_URL=...). The server and
its data are removed when kscope dev stops, also when it is killed:
--data-dir keeps the broker's data only. With --postgres auto (the
default), a machine without the server binaries gets the broker alone and
a note that says how to install them; --postgres on fails without them;
--postgres off starts the broker alone. Install them with
  Debian, Ubuntu:  apt-get install postgresql
  Fedora, RHEL:    dnf install postgresql-server
  macOS:           brew install postgresql (then --pg-bin "$(brew --prefix postgresql)/bin")

Examples:
  kscope dev
  kscope dev --port 19092 --data-dir ./.kafka --partitions 6
  kscope dev --port 0 --nodes 3 --group-min-session-timeout 100ms
  kscope dev --pg-port 15432
  kscope dev --postgres off`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			o := &devOpts{}
			fs.IntVar(&o.port, "port", 9092, "port of the first broker; the others take the next ones")
			fs.StringVar(&o.dataDir, "data-dir", "", "keep the broker's data in this directory across restarts")
			fs.IntVar(&o.partitions, "partitions", 3, "partitions of topics created on first use")
			fs.IntVar(&o.nodes, "nodes", 1, "number of brokers in the cluster")
			fs.DurationVar(&o.minSession, "group-min-session-timeout", 6*time.Second,
				"the smallest session timeout a group member may ask for (Kafka's group.min.session.timeout.ms); "+
					"lower it so that a killed consumer's partitions move on sooner")
			fs.StringVar(&o.postgres, "postgres", "auto", "start a throwaway PostgreSQL too: auto (when its server binaries are installed), on (fail without them), or off")
			fs.IntVar(&o.pgPort, "pg-port", 0, "port of the PostgreSQL server (0: a free one)")
			fs.StringVar(&o.pgBin, "pg-bin", "", "directory of the PostgreSQL server binaries, initdb and pg_ctl (default: found on PATH or in /usr/lib/postgresql/<newest>/bin)")
			return func(ctx context.Context) error { return dev(ctx, e, o) }
		},
	}
}

// devOpts are kscope dev's flags.
type devOpts struct {
	port, partitions, nodes int
	dataDir                 string
	minSession              time.Duration
	postgres, pgBin         string
	pgPort                  int
}

func (o *devOpts) check() error {
	switch {
	case o.port < 0 || o.port > 65535-o.nodes:
		return usagef("--port %d is not a usable port", o.port)
	case o.partitions < 1 || o.nodes < 1:
		return usagef("--partitions and --nodes must be at least 1")
	case o.minSession <= 0:
		return usagef("--group-min-session-timeout must be positive, got %v", o.minSession)
	case o.postgres != "auto" && o.postgres != "on" && o.postgres != "off":
		return usagef("unknown --postgres %q: use auto, on or off", o.postgres)
	case o.pgPort < 0 || o.pgPort > 65535:
		return usagef("--pg-port %d is not a usable port", o.pgPort)
	}
	return nil
}

func dev(ctx context.Context, e *env, o *devOpts) error {
	if err := o.check(); err != nil {
		return err
	}
	// PostgreSQL first: it is the one that may be missing or fail to
	// start, and then no broker was started for nothing.
	pg, err := devPostgres(ctx, e, o)
	if err != nil {
		return err
	}
	if pg != nil {
		defer pg.Close()
	}
	c, err := devBroker(o)
	if err != nil {
		return err
	}
	defer c.Close()
	addrs := strings.Join(c.ListenAddrs(), ",")
	fmt.Fprintf(e.stdout, "kscope dev: Kafka-protocol broker listening on %s\n", addrs)
	if pg != nil {
		at := pg.URL
		if u, err := url.Parse(pg.URL); err == nil {
			at = u.Host
		}
		fmt.Fprintf(e.stdout, "kscope dev: PostgreSQL listening on %s, a throwaway server: its data (%s) is removed when kscope dev stops\n", at, pg.DataDir)
	}
	if o.dataDir != "" {
		fmt.Fprintf(e.stdout, "kscope dev: broker data kept in %s\n", o.dataDir)
	}
	fmt.Fprintf(e.stdout, "export KAFKA_BROKERS=%s\n", addrs)
	if pg != nil {
		fmt.Fprintf(e.stdout, "export DATABASE_URL=%s\n", pg.URL)
	}
	fmt.Fprintln(e.stdout, "kscope dev: ready; Ctrl-C stops it")
	<-ctx.Done()
	c.Close()
	if pg != nil {
		pg.Close()
		fmt.Fprintln(e.stdout, "kscope dev: stopped; the PostgreSQL server and its data are gone")
		return nil
	}
	fmt.Fprintln(e.stdout, "kscope dev: stopped")
	return nil
}

func devBroker(o *devOpts) (*kfake.Cluster, error) {
	ports := make([]int, o.nodes)
	for i := range ports {
		ports[i] = o.port + i
		if o.port == 0 {
			ports[i] = 0
		}
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(o.nodes),
		kfake.Ports(ports...),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(o.partitions),
		kfake.GroupMinSessionTimeout(o.minSession),
	}
	if o.dataDir != "" {
		if err := os.MkdirAll(o.dataDir, 0o755); err != nil {
			return nil, fmt.Errorf("creating --data-dir %s: %w", o.dataDir, err)
		}
		opts = append(opts, kfake.DataDir(o.dataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("starting the broker (is port %d free? pick another with --port): %w", o.port, err)
	}
	return c, nil
}

// pgInstall says how to install the PostgreSQL server binaries.
const pgInstall = "install them (Debian, Ubuntu: apt-get install postgresql; Fedora, RHEL: dnf install postgresql-server; macOS: brew install postgresql) " +
	"or give their directory with --pg-bin"

// devPostgres starts the throwaway PostgreSQL server --postgres asks for:
// nil when off, or when auto and its binaries are missing (said on
// stderr).
func devPostgres(ctx context.Context, e *env, o *devOpts) (*testenv.Postgres, error) {
	if o.postgres == "off" {
		return nil, nil
	}
	bin := o.pgBin
	if bin != "" {
		if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
			return nil, fmt.Errorf("--pg-bin %s holds no initdb: give the directory of the PostgreSQL server binaries (initdb, pg_ctl), or run with --postgres off", bin)
		}
	} else {
		var err error
		bin, err = e.findPostgres()
		switch {
		case errors.Is(err, testenv.ErrNoPostgres) && o.postgres == "auto":
			fmt.Fprintf(e.stderr, "kscope dev: starting the broker alone: the PostgreSQL server binaries (initdb, pg_ctl) are not installed; "+
				"for a throwaway PostgreSQL as well, %s (--postgres off says nothing)\n", pgInstall)
			return nil, nil
		case errors.Is(err, testenv.ErrNoPostgres):
			return nil, fmt.Errorf("--postgres on, and the PostgreSQL server binaries (initdb, pg_ctl) are not installed: %s, or run with --postgres off", pgInstall)
		case err != nil:
			return nil, err
		}
	}
	pg, err := testenv.StartLocalPostgres(ctx, bin, testenv.PostgresOptions{Port: o.pgPort})
	if err != nil {
		port := "a free port"
		if o.pgPort != 0 {
			port = fmt.Sprintf("port %d (is it free? pick another with --pg-port)", o.pgPort)
		}
		return nil, fmt.Errorf("starting PostgreSQL from %s on %s failed (run with --postgres off for the broker alone): %w", bin, port, err)
	}
	return pg, nil
}
