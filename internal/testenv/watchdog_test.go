package testenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A test binary killed while its throwaway server runs (go test's timeout,
// kill -9) leaves no server behind: pg_ctl's server is a daemon, and the
// watchdog stops it and removes its directory.
func TestKilledTestBinaryLeavesNoServer(t *testing.T) {
	if os.Getenv("KSCOPE_TEST_WATCHDOG_CHILD") != "" {
		p, err := startLocalForTest()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(p.DataDir)
		select {} // killed by the parent
	}
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL names an external server: no throwaway server to check")
	}
	if _, err := FindPostgresBin(); err != nil {
		t.Skip(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledTestBinaryLeavesNoServer$")
	cmd.Env = append(os.Environ(), "KSCOPE_TEST_WATCHDOG_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "/") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the child started no server: %q, %v", line, err)
	}
	data := strings.TrimSpace(line)
	pid, err := os.ReadFile(data + "/postmaster.pid")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopLeftBehind(data) })
	server := strings.SplitN(string(pid), "\n", 2)[0]
	if _, err := os.Stat("/proc/" + server); err != nil {
		t.Fatalf("the server (pid %s) is not running before the kill: %v", server, err)
	}

	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup runs in the child
		t.Fatal(err)
	}
	cmd.Wait() //nolint:errcheck // killed

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		_, serr := os.Stat("/proc/" + server)
		_, derr := os.Stat(data)
		if os.IsNotExist(serr) && os.IsNotExist(derr) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("60 s after the test binary was killed, its server (pid %s) still runs (%v) or its directory %s is still there (%v)", server, serr == nil, data, derr == nil)
		case <-time.After(50 * time.Millisecond): // polling for the server to be gone
		}
	}
}

// stopLeftBehind stops the server of data dir, if it still runs, as the
// user that owns it, and removes its directory: what the watchdog should
// have done.
func stopLeftBehind(data string) {
	fi, err := os.Stat(data)
	if err != nil {
		return
	}
	bin, _ := FindPostgresBin()
	p := &Postgres{bin: bin}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
		p.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid}
	}
	p.run(context.Background(), "pg_ctl", "stop", "-m", "immediate", "-w", "-D", data) //nolint:errcheck // best effort
	os.RemoveAll(filepath.Dir(data))
}

func startLocalForTest() (*Postgres, error) {
	bin, err := FindPostgresBin()
	if err != nil {
		return nil, err
	}
	return startLocal(context.Background(), bin, PostgresOptions{})
}
