package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Postgres is a PostgreSQL backend: an external server, a throwaway local
// server, or a container.
type Postgres struct {
	// URL connects to the server's maintenance database as a superuser.
	URL string
	// Kind says which backend this is: "external", "local" or "container".
	Kind string
	// DataDir is the local server's data directory ("" otherwise).
	DataDir string

	bin  string
	cred *syscall.Credential
	stop func()
	once sync.Once
}

// PostgresOptions tune a throwaway local server.
type PostgresOptions struct {
	// Settings are extra server settings (name → value), such as
	// {"fsync": "off"} for tests that do not measure durability.
	Settings map[string]string
	// Port is the port the server listens on (on 127.0.0.1); 0 picks a
	// free one.
	Port int
}

// ErrNoPostgres says that no PostgreSQL is available, and how to provide one.
var ErrNoPostgres = errors.New("testenv: no PostgreSQL available: set DATABASE_URL to a server you own, " +
	"install the PostgreSQL server binaries (Debian: apt-get install postgresql) so a throwaway server can be started, " +
	"or set KSCOPE_TEST_CONTAINERS=1 with Docker running to use a container")

// StartPostgres returns a PostgreSQL backend chosen as the package doc says.
func StartPostgres(ctx context.Context, o PostgresOptions) (*Postgres, error) {
	if env := strings.TrimSpace(os.Getenv("DATABASE_URL")); env != "" {
		return &Postgres{URL: env, Kind: "external", stop: func() {}}, nil
	}
	if c, err := wantContainers(); err != nil {
		return nil, err
	} else if c != nil {
		u, stop, err := c.Postgres(ctx)
		if err != nil {
			return nil, fmt.Errorf("testenv: starting a PostgreSQL container: %w", err)
		}
		return &Postgres{URL: u, Kind: "container", stop: stop}, nil
	}
	bin, err := FindPostgresBin()
	if err != nil {
		return nil, err
	}
	return startLocal(ctx, bin, o)
}

// StartLocalPostgres starts a throwaway server from the PostgreSQL
// binaries in directory bin (see [FindPostgresBin]), whatever DATABASE_URL
// says: in a temporary directory, on 127.0.0.1, as the postgres user when
// run as root. Close stops it and removes its directory; a watchdog does
// so when this process ends without closing it.
func StartLocalPostgres(ctx context.Context, bin string, o PostgresOptions) (*Postgres, error) {
	return startLocal(ctx, bin, o)
}

// FindPostgresBin returns the directory of the PostgreSQL server binaries
// (initdb, pg_ctl): initdb's on PATH, else Debian's per-version directory
// /usr/lib/postgresql/<version>/bin (the newest version wins). It returns
// ErrNoPostgres when there are none.
func FindPostgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func startLocal(ctx context.Context, bin string, o PostgresOptions) (*Postgres, error) {
	dir, err := os.MkdirTemp("", "kscope-pg-")
	if err != nil {
		return nil, err
	}
	p := &Postgres{Kind: "local", bin: bin}
	// PostgreSQL refuses to run as root: run it as the postgres user.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: running as root, PostgreSQL must run as another user and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	cleanup := func() { os.RemoveAll(dir) }
	data := filepath.Join(dir, "data")
	if out, err := p.run(ctx, "initdb", "-D", data, "-U", "kscope", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		cleanup()
		return nil, fmt.Errorf("testenv: initdb: %w\n%s", err, out)
	}
	port := o.Port
	if port == 0 {
		if port, err = freePort(); err != nil {
			cleanup()
			return nil, err
		}
	}
	settings := []string{
		"-p", strconv.Itoa(port),
		"-k", dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=200",
	}
	keys := make([]string, 0, len(o.Settings))
	for k := range o.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		settings = append(settings, "-c", k+"="+o.Settings[k])
	}
	logFile := filepath.Join(dir, "server.log")
	if out, err := p.run(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", data, "-l", logFile, "-o", strings.Join(settings, " ")); err != nil {
		log, _ := os.ReadFile(logFile)
		cleanup()
		return nil, fmt.Errorf("testenv: pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	p.DataDir = data
	p.URL = fmt.Sprintf("postgres://kscope@127.0.0.1:%d/postgres?sslmode=disable", port)
	unwatch, err := p.watch(dir)
	if err != nil {
		p.run(context.Background(), "pg_ctl", "stop", "-m", "immediate", "-w", "-D", data) //nolint:errcheck // best effort on cleanup
		cleanup()
		return nil, err
	}
	p.stop = func() {
		p.run(context.Background(), "pg_ctl", "stop", "-m", "immediate", "-w", "-D", data) //nolint:errcheck // best effort on cleanup
		cleanup()
		unwatch()
	}
	return p, nil
}

// watch starts a watchdog that stops the server in dir, and removes dir,
// when this process ends without doing so (a test binary killed by its
// timeout, or with kill -9): pg_ctl's server is a daemon that would
// outlive it. The watchdog waits on a pipe whose write end only this
// process holds, so it wakes however this process ends; it runs in a
// process group of its own, so a Ctrl-C that ends the tests does not end
// it first. unwatch ends it once the server was stopped.
func (p *Postgres) watch(dir string) (unwatch func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/bin/sh", "-c", `read _ ; "$0" stop -m immediate -w -D "$1/data" >/dev/null 2>&1 ; rm -rf "$1"`,
		filepath.Join(p.bin, "pg_ctl"), dir)
	cmd.Stdin = r
	cmd.Dir = os.TempDir()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("testenv: starting the PostgreSQL server's watchdog: %w", err)
	}
	return func() {
		w.Close()
		cmd.Wait() //nolint:errcheck // the server is stopped already
	}, nil
}

func (p *Postgres) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, prog), args...)
	cmd.Dir = os.TempDir()
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	// pg_ctl's server must outlive a canceled ctx: only the command waits on it.
	cmd.WaitDelay = 0
	return cmd.CombinedOutput()
}

// Restart stops the local server (immediate mode: like a crash, without
// fsync loss) and starts it again on the same port. Only for "local".
func (p *Postgres) Restart(ctx context.Context) error {
	if p.Kind != "local" {
		return fmt.Errorf("testenv: restarting needs the local server, this one is %s", p.Kind)
	}
	// The server's output goes to its log file: a server writing to
	// pg_ctl's pipe would keep it open, and run would wait for it forever.
	logFile := filepath.Join(filepath.Dir(p.DataDir), "server.log")
	if out, err := p.run(ctx, "pg_ctl", "restart", "-m", "immediate", "-w", "-t", "60", "-D", p.DataDir, "-l", logFile); err != nil {
		return fmt.Errorf("testenv: pg_ctl restart: %w\n%s", err, out)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Close stops a local or container server (a no-op for an external one).
func (p *Postgres) Close() {
	p.once.Do(func() { p.stop() })
}

// NewDatabase creates a fresh database and returns its URL. Tests use one
// each, so they never see each other's rows.
func (p *Postgres) NewDatabase(ctx context.Context, prefix string) (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	name := sanitize(prefix) + "_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return "", fmt.Errorf("testenv: connecting to %s: %w", redact(p.URL), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("testenv: creating database %s: %w", name, err)
	}
	u, err := url.Parse(p.URL)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > 40 {
		out = out[:40]
	}
	if out == "" || (out[0] >= '0' && out[0] <= '9') {
		out = "db_" + out
	}
	return out
}

// redact removes a password from a connection URL for messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

var (
	sharedMu sync.Mutex
	sharedPG *Postgres
)

// DatabaseT returns the URL of a fresh database for one test, on a server
// shared by the test binary (started on first use; call [StopShared] from
// TestMain to stop it at exit).
func DatabaseT(t testing.TB) string {
	t.Helper()
	sharedMu.Lock()
	if sharedPG == nil {
		pg, err := StartPostgres(context.Background(), PostgresOptions{Settings: map[string]string{"fsync": "off"}})
		if err != nil {
			sharedMu.Unlock()
			t.Fatal(err)
		}
		sharedPG = pg
	}
	pg := sharedPG
	sharedMu.Unlock()
	u, err := pg.NewDatabase(context.Background(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// SharedPostgres returns the server DatabaseT uses, starting it if needed.
func SharedPostgres(t testing.TB) *Postgres {
	t.Helper()
	DatabaseT(t)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	return sharedPG
}

// StopShared stops the servers shared by the tests of one binary
// (PostgreSQL's and Redis's) and the spare Apache Kafka broker started
// ahead for the next test (see StartKafka). Call it from TestMain after
// m.Run.
func StopShared() {
	stopSpare()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedPG != nil {
		sharedPG.Close()
		sharedPG = nil
	}
	if sharedRedis != nil {
		sharedRedis.Close()
		sharedRedis = nil
	}
}

// DropDatabase drops the database url names, ending its open connections
// (PostgreSQL 13 or newer), through a connection to the server's
// "postgres" database.
func DropDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" || name == "postgres" {
		return fmt.Errorf("testenv: %s names no test database", redact(dbURL))
	}
	u.Path = "/postgres"
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return fmt.Errorf("testenv: connecting to %s: %w", redact(u.String()), err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}
