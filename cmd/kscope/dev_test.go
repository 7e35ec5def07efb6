package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// startDev runs "kscope dev --postgres off" with args and returns its
// broker address and a function that stops it and returns its exit code.
func startDev(t *testing.T, args ...string) (string, func() int) {
	t.Helper()
	d := startDevWith(t, nil, append([]string{"--postgres", "off"}, args...)...)
	return d.exports["KAFKA_BROKERS"], d.stop
}

// devRun is a running "kscope dev".
type devRun struct {
	exports map[string]string // the variables it printed to export
	lines   []string          // what it printed up to its last export
	stderr  *bytes.Buffer     // safe to read once stopped
	stop    func() int        // stops it and returns its exit code
}

// startDevWith runs "kscope dev --port 0" with args until it printed its
// exports (the line after the last one is not an export).
// find, when not nil, stands for testenv.FindPostgresBin.
func startDevWith(t *testing.T, find func() (string, error), args ...string) *devRun {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	d := &devRun{exports: map[string]string{}, stderr: &bytes.Buffer{}}
	e := &env{stdout: pw, stderr: d.stderr, getenv: os.Getenv, findPostgres: testenv.FindPostgresBin}
	if find != nil {
		e.findPostgres = find
	}
	go func() {
		code <- runEnv(ctx, e, append([]string{"dev", "--port", "0"}, args...))
		pw.Close()
	}()
	var stopped sync.Once
	exit := 0
	d.stop = func() int {
		stopped.Do(func() { cancel(); exit = <-code })
		return exit
	}
	t.Cleanup(func() { d.stop() })
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		d.lines = append(d.lines, sc.Text())
		name, value, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok && strings.HasPrefix(sc.Text(), "export ") {
			d.exports[name] = value
		} else if len(d.exports) > 0 {
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if d.exports["KAFKA_BROKERS"] == "" {
		t.Fatalf("kscope dev printed no address (exit %d): %q", d.stop(), d.lines)
	}
	return d
}

func roundTrip(t *testing.T, addr string, produce bool) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("dev-topic"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if produce {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "dev-topic", Value: []byte("hello")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for len(got) == 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("no record came back from the dev broker")
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

// kscope dev serves the Kafka protocol to any client; with --data-dir the
// data survives a restart.
func TestDevBroker(t *testing.T) {
	dir := t.TempDir()
	addr, stop := startDev(t, "--data-dir", dir)
	if got := roundTrip(t, addr, true); strings.Join(got, ",") != "hello" {
		t.Fatalf("read back %v", got)
	}
	if c := stop(); c != 0 {
		t.Fatalf("exit %d", c)
	}
	addr, stop = startDev(t, "--data-dir", dir)
	defer stop()
	if got := roundTrip(t, addr, false); strings.Join(got, ",") != "hello" {
		t.Fatalf("after a restart with --data-dir: %v", got)
	}
}

func TestDevBadFlags(t *testing.T) {
	if res := kscope(t, "dev", "--partitions", "0"); res.code != 2 {
		t.Fatalf("--partitions 0: %+v", res)
	}
	if res := kscope(t, "dev", "--nodes", "0"); res.code != 2 {
		t.Fatalf("--nodes 0: %+v", res)
	}
	if res := kscope(t, "dev", "--brokers", "3"); res.code != 2 {
		t.Fatalf("--brokers (now --nodes) was accepted: %+v", res)
	}
	if res := kscope(t, "dev", "--group-min-session-timeout", "0s"); res.code != 2 {
		t.Fatalf("--group-min-session-timeout 0s: %+v", res)
	}
}

// kscope dev starts a throwaway PostgreSQL with the broker and prints its
// URL; a service's tables can be made in it, and once kscope dev stops,
// the server and its data directory are gone.
func TestDevPostgres(t *testing.T) {
	if _, err := testenv.FindPostgresBin(); err != nil {
		t.Skip(err)
	}
	d := startDevWith(t, nil, "--postgres", "on")
	url := d.exports["DATABASE_URL"]
	if url == "" {
		t.Fatalf("no DATABASE_URL printed: %q", d.lines)
	}
	var dataDir string
	for _, l := range d.lines {
		if _, rest, ok := strings.Cut(l, "a throwaway server: its data ("); ok {
			dataDir, _, _ = strings.Cut(rest, ")")
		}
	}
	if dataDir == "" {
		t.Fatalf("no data directory printed: %q", d.lines)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := dbscope.Migrate(ctx, conn, ""); err != nil {
		t.Fatal(err)
	}
	host := net.JoinHostPort(conn.Config().Host, strconv.Itoa(int(conn.Config().Port)))
	conn.Close(ctx)
	if got := roundTrip(t, d.exports["KAFKA_BROKERS"], true); strings.Join(got, ",") != "hello" {
		t.Fatalf("read back %v", got)
	}
	if c := d.stop(); c != 0 {
		t.Fatalf("exit %d: %s", c, d.stderr)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("the data directory %s is still there (%v)", dataDir, err)
	}
	if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
		c.Close()
		t.Errorf("PostgreSQL still listens on %s after kscope dev stopped", host)
	}
}

// Without the PostgreSQL server binaries, kscope dev starts the broker
// alone and says how to install them; with --postgres on it fails, starts
// nothing, and says so; a --pg-bin without them fails.
func TestDevWithoutPostgresBinaries(t *testing.T) {
	none := func() (string, error) { return "", testenv.ErrNoPostgres }
	d := startDevWith(t, none)
	if _, ok := d.exports["DATABASE_URL"]; ok {
		t.Fatalf("DATABASE_URL printed without a server: %q", d.lines)
	}
	if got := roundTrip(t, d.exports["KAFKA_BROKERS"], true); strings.Join(got, ",") != "hello" {
		t.Fatalf("read back %v", got)
	}
	if c := d.stop(); c != 0 {
		t.Fatalf("exit %d", c)
	}
	for _, want := range []string{"starting the broker alone", "PostgreSQL server binaries (initdb, pg_ctl) are not installed", "apt-get install postgresql", "--pg-bin"} {
		if !strings.Contains(d.stderr.String(), want) {
			t.Errorf("stderr lacks %q: %s", want, d.stderr)
		}
	}

	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: os.Getenv, findPostgres: none}
	if c := runEnv(context.Background(), e, []string{"dev", "--port", "0", "--postgres", "on"}); c != exitFailure ||
		!strings.Contains(errb.String(), "are not installed: install them (Debian, Ubuntu: apt-get install postgresql") || out.Len() > 0 {
		t.Fatalf("--postgres on without the binaries: exit %d\nstdout: %s\nstderr: %s", c, &out, &errb)
	}
	missing := t.TempDir()
	kscope(t, "dev", "--port", "0", "--pg-bin", missing).want(t, exitFailure, "--pg-bin "+missing+" holds no initdb", "--postgres off")
	kscope(t, "dev", "--postgres", "maybe").want(t, exitUsage, `unknown --postgres "maybe"`)
}
