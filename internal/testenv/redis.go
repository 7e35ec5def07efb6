package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Redis is a Redis backend: an external server (REDIS_URL) or a throwaway
// redis-server started on a free loopback port, in a temporary directory,
// with no persistence.
type Redis struct {
	// URL is the server's address, as go-redis's ParseURL reads it
	// (redis://127.0.0.1:port/0).
	URL string
	// Kind says which backend this is: "external" or "local".
	Kind string
	// Dir is the local server's directory ("" otherwise).
	Dir string

	bin     string
	port    int
	unwatch func()

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	closed bool
}

// ErrNoRedis says that no Redis is available, and how to provide one.
var ErrNoRedis = errors.New("testenv: no Redis available: set REDIS_URL to a server you own (redis://host:port/db), " +
	"or install the Redis server (Debian: apt-get install redis-server) so a throwaway server can be started")

// StartRedis returns the server REDIS_URL names when it is set, else a
// throwaway local one ([StartLocalRedis]).
func StartRedis(ctx context.Context) (*Redis, error) {
	if env := strings.TrimSpace(os.Getenv("REDIS_URL")); env != "" {
		return &Redis{URL: env, Kind: "external"}, nil
	}
	return StartLocalRedis(ctx)
}

// StartLocalRedis starts redis-server (found on PATH, else ErrNoRedis),
// whatever REDIS_URL says: on a free port of 127.0.0.1, in a temporary
// directory, without snapshots or an append-only file, and waits until it
// answers PING. Close stops it and removes its directory; when this
// process dies without closing it, the kernel kills the server and a
// watchdog removes the directory.
func StartLocalRedis(ctx context.Context) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedis
	}
	dir, err := os.MkdirTemp("", "kscope-redis-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	unwatch, err := watchDir(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	r := &Redis{Kind: "local", Dir: dir, bin: bin, port: port, unwatch: unwatch,
		URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port)}
	if err := r.Start(ctx); err != nil {
		os.RemoveAll(dir)
		unwatch()
		return nil, err
	}
	return r, nil
}

// watchDir starts a watchdog that removes dir when this process ends
// without doing so (killed by go test's timeout, or with kill -9; the
// kernel kills the server itself, see childProcAttr). It waits on a pipe
// whose write end only this process holds, in a process group of its own;
// unwatch ends it.
func watchDir(dir string) (unwatch func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/bin/sh", "-c", `read _ ; rm -rf "$0"`, dir)
	cmd.Stdin = r
	cmd.Dir = os.TempDir()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("testenv: starting the Redis server's watchdog: %w", err)
	}
	return func() {
		w.Close()
		cmd.Wait() //nolint:errcheck // it removes a directory already gone
	}, nil
}

// Addr is the server's host:port (local servers only: "" otherwise).
func (r *Redis) Addr() string {
	if r.Kind != "local" {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
}

// Start starts the local server again after Stop, on the same port (the
// data it held is gone: it keeps none), and waits (bounded by ctx and 30
// seconds) until it answers PING. StartLocalRedis calls it first.
func (r *Redis) Start(ctx context.Context) error {
	if r.Kind != "local" {
		return fmt.Errorf("testenv: starting Redis needs the throwaway local server, this one is %s (REDIS_URL)", r.Kind)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("testenv: the Redis server is closed")
	}
	if r.cmd != nil {
		return errors.New("testenv: the Redis server is running; Stop it first")
	}
	logFile := filepath.Join(r.Dir, "redis.log")
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.Dir, "--logfile", logFile)
	cmd.Dir = r.Dir
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: starting redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait() //nolint:errcheck // Stop kills it
		close(exited)
	}()
	r.cmd, r.exited = cmd, exited
	if err := r.waitPing(ctx, exited); err != nil {
		killGroup(cmd)
		<-exited
		r.cmd = nil
		return fmt.Errorf("%w; its log ends:\n%s", err, tailFile(logFile, 20))
	}
	return nil
}

func (r *Redis) waitPing(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := ping(ctx, r.Addr())
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("testenv: redis-server exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("testenv: redis-server on %s did not answer PING within 30s (last error: %v)", r.Addr(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ping sends PING over a new connection and reads the reply.
func ping(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second)) //nolint:errcheck // a new TCP connection
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// Stop kills the local server (SIGKILL, like a crash) and waits until it
// is gone: clients' calls fail until Start. Only for "local".
func (r *Redis) Stop() error {
	if r.Kind != "local" {
		return fmt.Errorf("testenv: stopping Redis needs the throwaway local server, this one is %s (REDIS_URL)", r.Kind)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return errors.New("testenv: the Redis server is not running")
	}
	killGroup(r.cmd)
	<-r.exited
	r.cmd = nil
	return nil
}

// Close stops a local server and removes its directory (a no-op for an
// external one). It is idempotent.
func (r *Redis) Close() {
	if r.Kind != "local" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	if r.cmd != nil {
		killGroup(r.cmd)
		<-r.exited
		r.cmd = nil
	}
	os.RemoveAll(r.Dir)
	r.unwatch()
}

var sharedRedis *Redis // guarded by sharedMu

// RedisT returns the Redis server shared by the test binary: REDIS_URL's,
// or a throwaway one started on first use ([StopShared] stops it). A test
// that cannot have one fails, saying what to install. Tests share it:
// give each its own key prefix. A test that stops the server starts one
// of its own ([StartLocalRedis]).
func RedisT(t testing.TB) *Redis {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedRedis == nil {
		r, err := StartRedis(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		sharedRedis = r
	}
	return sharedRedis
}

// LocalRedisT starts a throwaway redis-server of the test's own, stopped
// when the test ends: for a test that stops and starts it (the shared one
// and REDIS_URL's are not to be stopped). Without redis-server the test
// fails saying what to install, or, when REDIS_URL is set, is skipped.
func LocalRedisT(t testing.TB) *Redis {
	t.Helper()
	r, err := StartLocalRedis(context.Background())
	if errors.Is(err, ErrNoRedis) && strings.TrimSpace(os.Getenv("REDIS_URL")) != "" {
		t.Skip("this test stops and starts a Redis server of its own, and redis-server is not installed: install it (Debian: apt-get install redis-server)")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}
