package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A throwaway Redis answers PING, stops (calls fail), starts again on the
// same address, and Close leaves neither a process nor a directory.
func TestLocalRedisStopStartClose(t *testing.T) {
	ctx := context.Background()
	r := LocalRedisT(t)
	if err := ping(ctx, r.Addr()); err != nil {
		t.Fatalf("PING after start: %v", err)
	}
	pid := r.cmd.Process.Pid
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, r.Addr()); err == nil {
		t.Fatal("PING answered after Stop")
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Fatalf("redis-server (pid %d) still runs after Stop", pid)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, r.Addr()); err != nil {
		t.Fatalf("PING after a restart on the same port: %v", err)
	}
	if err := r.Start(ctx); err == nil {
		t.Fatal("Start of a running server succeeded")
	}
	pid = r.cmd.Process.Pid
	r.Close()
	if _, err := os.Stat(r.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the server's directory %s is still there after Close: %v", r.Dir, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Fatalf("redis-server (pid %d) still runs after Close", pid)
	}
	if err := r.Start(ctx); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

// Without redis-server, starting one fails with a sentence that says what
// to install, or to set REDIS_URL.
func TestNoRedisErrorSaysWhatToInstall(t *testing.T) {
	for _, want := range []string{"REDIS_URL", "apt-get install redis-server"} {
		if !strings.Contains(ErrNoRedis.Error(), want) {
			t.Fatalf("ErrNoRedis does not mention %s: %v", want, ErrNoRedis)
		}
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := StartLocalRedis(context.Background()); !errors.Is(err, ErrNoRedis) {
		t.Fatalf("StartLocalRedis without redis-server on PATH: %v; want ErrNoRedis", err)
	}
}

// A test binary killed while its throwaway Redis runs leaves neither the
// server nor its directory behind.
func TestKilledTestBinaryLeavesNoRedis(t *testing.T) {
	if os.Getenv("KSCOPE_TEST_REDIS_CHILD") != "" {
		r, err := StartLocalRedis(context.Background())
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(r.Dir, r.cmd.Process.Pid)
		select {} // killed by the parent
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledTestBinaryLeavesNoRedis$")
	cmd.Env = append(os.Environ(), "KSCOPE_TEST_REDIS_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	var dir string
	var pid int
	if _, serr := fmt.Sscan(line, &dir, &pid); err != nil || serr != nil || !strings.HasPrefix(dir, "/") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the child started no server: %q, %v", line, err)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup runs in the child
		t.Fatal(err)
	}
	cmd.Wait() //nolint:errcheck // killed
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, serr := os.Stat(fmt.Sprintf("/proc/%d", pid))
		_, derr := os.Stat(dir)
		if os.IsNotExist(serr) && os.IsNotExist(derr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the test binary was killed, its redis-server (pid %d) still runs (%v) or its directory %s is still there (%v)", pid, serr == nil, dir, derr == nil)
		}
		time.Sleep(50 * time.Millisecond) // polling for the server to be gone
	}
}
