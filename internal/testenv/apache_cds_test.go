package testenv

import (
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
