package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// startDev runs "kscope dev" with args and returns its broker address and a
// function that stops it and returns its exit code.
func startDev(t *testing.T, args ...string) (string, func() int) {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, append([]string{"dev", "--port", "0"}, args...), pw, io.Discard)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var addr string
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "export KAFKA_BROKERS="); ok {
			addr = a
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if addr == "" {
		cancel()
		t.Fatalf("kscope dev printed no address (exit %d)", <-code)
	}
	return addr, func() int { cancel(); return <-code }
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
