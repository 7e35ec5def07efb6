package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/dbscope"
	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// Distinctive strings that must never reach a log line or a routing header.
const (
	secretPassword = "kscope-S3cret-pw-7f3a9c"
	secretPayload  = "CARD-4111111111111111-payload-d41d8c"
)

// testCA is a throwaway certificate authority and a server certificate for
// 127.0.0.1 and localhost, signed by it.
type testCA struct {
	pool            *x509.CertPool
	caPEM           []byte
	certPEM, keyPEM []byte // the server's
	server          tls.Certificate
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kscope test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{pool: x509.NewCertPool()}
	ca.pool.AddCert(caCert)
	ca.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	ca.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	ca.keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	ca.server, err = tls.X509KeyPair(ca.certPEM, ca.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// logCapture is a slog handler that keeps every formatted line.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *logCapture) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{c}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lockedWriter struct{ c *logCapture }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.buf.Write(p)
}

func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// mustNotLeak fails t when any secret appears in text.
func mustNotLeak(t *testing.T, where, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s contains the secret %q", where, s)
		}
	}
}

// A runner consumes from a cluster that requires TLS and SASL (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512), configured through Config.ClientOptions
// as docs/operations.md shows; with a wrong password Run returns an error that
// points at the SASL settings (kfake hangs up on a failed authentication
// where Kafka answers SASL_AUTHENTICATION_FAILED, which the runner also
// ends Run on). Neither the password nor a poison record's
// payload appears in the logs or in the dead-letter record's headers.
func TestReliabilityTLSAndSASL(t *testing.T) {
	if os.Getenv("KAFKA_BROKERS") != "" || os.Getenv("KSCOPE_TEST_CONTAINERS") == "1" {
		t.Skip("TLS and SASL are tested on the in-process kfake cluster, which this run does not use")
	}
	ca := newTestCA(t)
	cl, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{ca.server}, MinVersion: tls.VersionTLS12}),
		kfake.SeedTopics(2, "secure-0", "secure-1", "secure-2"),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "svc-plain", secretPassword),
		kfake.Superuser("SCRAM-SHA-256", "svc-256", secretPassword),
		kfake.Superuser("SCRAM-SHA-512", "svc-512", secretPassword),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	clientTLS := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}
	mechs := []struct {
		name string
		mech func(pass string) sasl.Mechanism
	}{
		{"PLAIN", func(p string) sasl.Mechanism { return plain.Auth{User: "svc-plain", Pass: p}.AsMechanism() }},
		{"SCRAM-SHA-256", func(p string) sasl.Mechanism { return scram.Auth{User: "svc-256", Pass: p}.AsSha256Mechanism() }},
		{"SCRAM-SHA-512", func(p string) sasl.Mechanism { return scram.Auth{User: "svc-512", Pass: p}.AsSha512Mechanism() }},
	}
	for i, m := range mechs {
		t.Run(m.name, func(t *testing.T) {
			security := []kgo.Opt{kgo.DialTLSConfig(clientTLS), kgo.SASL(m.mech(secretPassword))}
			topic, group := fmt.Sprintf("secure-%d", i), fmt.Sprintf("g-secure-%d", i)
			prod, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cl.ListenAddrs()...)}, security...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const n = 50
			var recs []*kgo.Record
			for j := range n {
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", j%5)), Value: []byte(fmt.Sprintf("v%d", j))})
			}
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("poison"), Value: []byte(secretPayload)})
			if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}

			logs := &logCapture{}
			var handled atomic.Int64
			r, err := consumer.New(consumer.Config{
				Brokers: cl.ListenAddrs(), Group: group, Topics: []string{topic}, Shards: 2,
				CommitInterval: 50 * time.Millisecond, Logger: logs.logger(),
				ClientOptions: security,
				Failures:      retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: time.Millisecond},
			}, consumer.HandlerFunc(func(ctx context.Context, rec *consumer.Record) error {
				if string(rec.Key) == "poison" {
					return consumer.DecodeError(errors.New("the order cannot be decoded"))
				}
				handled.Add(1)
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			stop := runRunner(t, r.Run)
			testenv.WaitFor(t, time.Minute, "every record handled over TLS and SASL", func() bool { return handled.Load() == n })
			dlt := readAllWith(t, cl.ListenAddrs(), security, retrytopic.DLTopic(group), 1)
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for _, h := range dlt[0].Headers {
				mustNotLeak(t, "DLT header "+h.Key, string(h.Value), secretPayload, secretPassword)
				if h.Key == retrytopic.HeaderError && len(h.Value) > retrytopic.MaxErrorLength {
					t.Errorf("the error header holds %d bytes, more than MaxErrorLength", len(h.Value))
				}
			}
			mustNotLeak(t, "the runner's log", logs.String(), secretPayload, secretPassword)

			// The same runner with a wrong password stops with an error
			// that says so, and logs no password either.
			badLogs := &logCapture{}
			bad, err := consumer.New(consumer.Config{
				Brokers: cl.ListenAddrs(), Group: group + "-bad", Topics: []string{topic}, Logger: badLogs.logger(),
				ClientOptions: []kgo.Opt{kgo.DialTLSConfig(clientTLS), kgo.SASL(m.mech(secretPassword + "-wrong"))},
			}, consumer.HandlerFunc(func(context.Context, *consumer.Record) error { return nil }))
			if err != nil {
				t.Fatal(err)
			}
			runCtx, runCancel := context.WithTimeout(context.Background(), time.Minute)
			defer runCancel()
			err = bad.Run(runCtx)
			if !errors.Is(err, consumer.ErrBrokerSetup) || runCtx.Err() != nil || !strings.Contains(strings.ToUpper(err.Error()), "SASL") {
				t.Fatalf("Run with a wrong password returned %v, want an authentication error before its deadline", err)
			}
			mustNotLeak(t, "Run's error", err.Error(), secretPassword)
			mustNotLeak(t, "the log of the run with a wrong password", badLogs.String(), secretPassword)
			t.Logf("wrong password: %v", err)
		})
	}
}

// runRunner runs run in a goroutine; stop cancels it and returns its error.
func runRunner(t *testing.T, run func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(time.Minute):
				err = errors.New("Run did not return within a minute of its cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// readAllWith reads at least n records of topic with the given client
// options.
func readAllWith(t *testing.T, brokers []string, opts []kgo.Opt, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records from %s", len(out), n, topic)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

// A DB-scope pipeline whose connection string carries a password, fed a
// poison record, through a PostgreSQL restart (so connection errors are
// logged): neither the password nor the payload reaches the log or the
// dead-letter record's headers.
func TestReliabilitySecretsStayOutOfLogs(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	if pg.Kind != "local" {
		t.Skip("the test restarts PostgreSQL: it needs the throwaway local server")
	}
	ctx := context.Background()
	_, dbURL := dbEnv(t)
	u, err := url.Parse(strings.TrimPrefix(dbURL, "DATABASE_URL="))
	if err != nil {
		t.Fatal(err)
	}
	// The throwaway server trusts local connections: any password works,
	// and this one must never be printed.
	u.User = url.UserPassword(u.User.Username(), secretPassword)
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	k := testenv.KafkaT(t)
	const topic, group = "secrets", "g-secrets"
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, topic, 10, 30)
	if err := k.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("poison"), Value: []byte(secretPayload)}); err != nil {
		t.Fatal(err)
	}
	logs := &logCapture{}
	r, err := dbscope.New(consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{topic}, Shards: 4,
		CommitInterval: 50 * time.Millisecond, Logger: logs.logger(),
		Failures: retrytopic.Policy{Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond},
	}, dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
		if string(r.Key) == "poison" {
			return consumer.DecodeError(errors.New("the payment cannot be decoded"))
		}
		if _, seq, _ := testenv.ParseKeyed(r.Value); seq == 5 {
			// A slow statement, so the restart below catches transactions
			// in flight.
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.05)`); err != nil {
				return err
			}
		}
		key, seq, _ := testenv.ParseKeyed(r.Value)
		_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, consumer.Identity{}.Of(r), key, seq)
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runRunner(t, r.Run)
	testenv.WaitFor(t, time.Minute, "some records applied", func() bool { return r.Stats().DB.Applied > 0 })
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "every record applied", func() bool { return r.Stats().DB.Applied >= int64(total) })
	testenv.WaitFor(t, time.Minute, "the poison record dead-lettered", func() bool {
		ends, err := k.EndOffsets(ctx, retrytopic.DLTopic(group))
		return err == nil && ends[0]+ends[1] >= 1
	})
	dlt := k.ReadAll(t, retrytopic.DLTopic(group))
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(dlt) != 1 {
		t.Fatalf("%d dead-letter records, want the poison one", len(dlt))
	}
	for _, h := range dlt[0].Headers {
		mustNotLeak(t, "DLT header "+h.Key, string(h.Value), secretPayload, secretPassword)
	}
	mustNotLeak(t, "the runner's log", logs.String(), secretPayload, secretPassword)
	if !strings.Contains(logs.String(), "level=") {
		t.Fatal("nothing was logged: the test saw no log to check")
	}
}

// PostgreSQL over TLS is pgx's sslmode in the connection string: a
// throwaway server with ssl=on and a certificate from a test CA serves a
// DB-scope pipeline over a verified TLS connection (sslmode=verify-full),
// and refuses a client that trusts another CA.
func TestReliabilityPostgresTLS(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" || os.Getenv("KSCOPE_TEST_CONTAINERS") == "1" {
		t.Skip("TLS to PostgreSQL is tested on a throwaway local server, which this run does not use")
	}
	ca := newTestCA(t)
	dir, err := os.MkdirTemp("", "kscope-pgtls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), filepath.Join(dir, "ca.crt")
	for _, f := range []struct {
		path string
		data []byte
	}{{certFile, ca.certPEM}, {keyFile, ca.keyPEM}, {caFile, ca.caPEM}} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The server runs as the postgres user when the tests run as root, and
	// it reads its key only when the key is its own, mode 0600.
	if os.Geteuid() == 0 {
		pgUser, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("no postgres user to run the server as: %v", err)
		}
		uid, _ := strconv.Atoi(pgUser.Uid)
		gid, _ := strconv.Atoi(pgUser.Gid)
		for _, f := range []string{certFile, keyFile} {
			if err := os.Chown(f, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": certFile, "ssl_key_file": keyFile, "fsync": "off",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	secure := strings.Replace(pg.URL, "sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(caFile), 1)
	pool, err := pgxpool.New(ctx, secure)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var ssl bool
	var version string
	if err := pool.QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version); err != nil {
		t.Fatal(err)
	}
	if !ssl {
		t.Fatal("the connection is not encrypted")
	}
	if err := dbscope.Migrate(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, effectsDDL); err != nil {
		t.Fatal(err)
	}
	k := testenv.KafkaT(t)
	if err := k.CreateTopic(ctx, "pgtls", 2); err != nil {
		t.Fatal(err)
	}
	total := k.ProduceKeyed(t, "pgtls", 5, 20)
	r, err := dbscope.New(consumer.Config{Brokers: k.Brokers, Group: "g-pgtls", Topics: []string{"pgtls"}, Shards: 2, Logger: relLogger()},
		dbscope.Options{Pool: pool}, dbscope.HandlerFunc(func(ctx context.Context, tx pgx.Tx, r *consumer.Record) error {
			key, seq, _ := testenv.ParseKeyed(r.Value)
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, key, seq) VALUES ($1, $2, $3)`, consumer.Identity{}.Of(r), key, seq)
			return err
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := runRunner(t, r.Run)
	testenv.WaitFor(t, time.Minute, "every record applied over TLS", func() bool { return r.Stats().DB.Applied >= int64(total) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if rows, unique := effectCount(t, pool); rows != total || unique != total {
		t.Fatalf("%d effects (%d unique) for %d records", rows, unique, total)
	}

	// A client that trusts another CA refuses the server.
	other := newTestCA(t)
	otherCA := filepath.Join(dir, "other-ca.crt")
	if err := os.WriteFile(otherCA, other.caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	wrong := strings.Replace(pg.URL, "sslmode=disable", "sslmode=verify-full&sslrootcert="+url.QueryEscape(otherCA), 1)
	conn, err := pgx.Connect(ctx, wrong)
	if err == nil {
		conn.Close(ctx)
		t.Fatal("a client trusting another CA connected")
	}
	t.Logf("TLS %s; another CA: %v", version, err)
}
