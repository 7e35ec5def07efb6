package testenv

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestBrokersMapTheClassArchive checks that an Apache Kafka broker starts
// from the class archive in the cache: its JVM is told to use it, and has
// it mapped (a JVM that rejects an archive, written by another JDK or for
// other jars, runs on without mapping it, only slower).
func TestBrokersMapTheClassArchive(t *testing.T) {
	if kind, _ := KafkaKind(); kind != "apache" {
		t.Skipf("the Apache Kafka backend is selected with %s=apache", KafkaEnv)
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads the JVM's memory map from /proc")
	}
	if os.Getenv(classArchiveEnv) == "off" {
		t.Skipf("%s=off", classArchiveEnv)
	}
	k := ApacheKafkaT(t, ApacheOptions{})
	nd := k.Apache.nodes[0]
	var archive string
	for _, a := range nd.cmd.Args {
		if v, ok := strings.CutPrefix(a, "-XX:SharedArchiveFile="); ok {
			archive = v
		}
	}
	if archive == "" {
		t.Fatalf("the broker's JVM was started without -XX:SharedArchiveFile: %q", nd.cmd.Args)
	}
	dir, err := apacheCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(archive) != dir {
		t.Fatalf("archive %s is not in the cache directory %s", archive, dir)
	}
	maps, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(nd.cmd.Process.Pid), "maps"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(maps), archive) {
		t.Fatalf("the broker's JVM does not map %s (it rejected the archive); its output:\n%s", archive, tailFile(filepath.Join(nd.dir, "stdout.log"), 20))
	}
}

// TestAClassArchiveCutShortIsRefused checks the check an archive passes
// before it is kept: the archive made, and not a copy of it cut short
// (a JVM killed while writing it), which would crash every broker.
func TestAClassArchiveCutShortIsRefused(t *testing.T) {
	if kind, _ := KafkaKind(); kind != "apache" {
		t.Skipf("the Apache Kafka backend is selected with %s=apache", KafkaEnv)
	}
	if os.Getenv(classArchiveEnv) == "off" {
		t.Skipf("%s=off", classArchiveEnv)
	}
	ctx := context.Background()
	java, err := javaPath()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := ApacheKafkaClasspath(ctx)
	if err != nil {
		t.Fatal(err)
	}
	archive := sharedArchive(ctx, java, cp)
	if archive == "" {
		t.Fatal("no class archive was made")
	}
	dir := t.TempDir()
	if err := checkArchive(ctx, java, cp, archive, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.jsa")
	if err := os.WriteFile(cut, b[:len(b)/3], 0o444); err != nil {
		t.Fatal(err)
	}
	if err := checkArchive(ctx, java, cp, cut, dir); err == nil {
		t.Fatal("an archive cut to a third passed the check")
	}
}
