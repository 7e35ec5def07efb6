package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The broker's classes, archived once (Application Class-Data Sharing,
// JDK 13 and newer): a JVM that maps the archive starts its broker in
// about half the time and CPU of one that loads and verifies each class
// from the jars (0.9 s and 0.8 s of CPU against 1.5 s and 1.4 s here), and
// the suites on Apache Kafka start a broker for nearly every test.

// classArchive is this process's class archive: made or found once.
var classArchive struct {
	once sync.Once
	path string // "" when brokers start without one
}

// classArchiveEnv set to "off" starts every broker without the archive.
const classArchiveEnv = "KSCOPE_KAFKA_CLASS_ARCHIVE"

// sharedArchive returns the class archive of the broker on java with
// classpath cp, in the cache directory, made the first time (once per
// cache, JDK and classpath; other processes wait for the one making it).
// It returns "" when it cannot, and the brokers then start without.
func sharedArchive(ctx context.Context, java, cp string) string {
	if os.Getenv(classArchiveEnv) == "off" {
		return ""
	}
	classArchive.once.Do(func() {
		p, err := makeArchive(ctx, java, cp)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testenv: Apache Kafka brokers start without a class archive (slower): %v\n", err)
			return
		}
		classArchive.path = p
	})
	return classArchive.path
}

// archiveName names the archive of java and cp: a JDK updated in place
// or a classpath resolved again gets an archive of its own, since a JVM
// ignores (and warns of) one that another JDK or other jars wrote.
func archiveName(java, cp string) (string, error) {
	real, err := filepath.EvalSymlinks(java)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%d\n%d\n%s\n", real, fi.Size(), fi.ModTime().UnixNano(), cp)
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(cp)), "resolved")); err == nil {
		h.Write(b)
	}
	return "classes-" + hex.EncodeToString(h.Sum(nil)[:8]) + ".jsa", nil
}

// makeArchive returns the path of the archive of java and cp, making it
// when the cache has none: a broker run with -XX:ArchiveClassesAtExit,
// taken through a produce and a group's consume so that the classes of
// those paths are in it too, and stopped with SIGTERM (the JVM writes the
// archive as it exits). The archive is moved into place only once a JVM
// started with it.
func makeArchive(ctx context.Context, java, cp string) (string, error) {
	dir, err := apacheCacheDir()
	if err != nil {
		return "", err
	}
	name, err := archiveName(java, cp)
	if err != nil {
		return "", err
	}
	final := filepath.Join(dir, name)
	if fileExists(final) {
		return final, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "classes.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if fileExists(final) {
		return final, nil // another process made it meanwhile
	}
	partial := final + ".partial"
	os.Remove(partial)
	defer os.Remove(partial)
	mctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := tryStartApache(mctx, java, cp, 1, ApacheOptions{}, []string{"-XX:ArchiveClassesAtExit=" + partial})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := exercise(mctx, c.Brokers()); err != nil {
		return "", fmt.Errorf("exercising the archiving broker: %w", err)
	}
	nd := c.nodes[0]
	if err := syscall.Kill(nd.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		return "", err
	}
	select {
	case <-nd.exited:
	case <-mctx.Done():
		return "", errors.New("the archiving broker did not exit within 3 minutes of SIGTERM")
	}
	if fi, err := os.Stat(partial); err != nil || fi.Size() == 0 {
		return "", fmt.Errorf("the JVM wrote no archive (%v); its output ends:\n%s", err, tailFile(filepath.Join(nd.dir, "stdout.log"), 20))
	}
	if err := checkArchive(mctx, java, cp, partial, c.Dir); err != nil {
		return "", err
	}
	if err := os.Rename(partial, final); err != nil {
		return "", err
	}
	return final, nil
}

// exercise produces a record to a new topic and consumes it in a group,
// committing its offset.
func exercise(ctx context.Context, brokers []string) error {
	const topic = "kscope-class-archive"
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ConsumerGroup("kscope-class-archive"), kgo.ConsumeTopics(topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	k := &Kafka{Brokers: brokers, adminCl: cl}
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		return err
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
		return err
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		if fs.NumRecords() > 0 {
			return cl.CommitUncommittedOffsets(ctx)
		}
	}
}

// checkArchive starts a JVM on java and cp told to use the archive at path
// or fail (-Xshare:on), in dir: an archive cut short crashes every JVM
// that maps it (SIGBUS), even one that would run on without it.
func checkArchive(ctx context.Context, java, cp, path, dir string) error {
	cmd := exec.CommandContext(ctx, java, "-XX:SharedArchiveFile="+path, "-Xshare:on",
		"-XX:ErrorFile="+filepath.Join(dir, "hs_err_%p.log"), "-cp", cp, "-version")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "sharing") {
		return fmt.Errorf("a JVM could not map the class archive %s (%v):\n%s", path, err, out)
	}
	return nil
}
