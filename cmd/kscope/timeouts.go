package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The defaults of --connect-timeout and --request-timeout.
const (
	defaultConnectTimeout = 10 * time.Second
	defaultRequestTimeout = 15 * time.Second
)

// timeouts bound how long a command waits for a server: to connect
// (--connect-timeout), and for the answer to a request (--request-timeout).
type timeouts struct {
	connect, request time.Duration
}

// timeoutFlags declares --connect-timeout and --request-timeout.
func timeoutFlags(fs *flag.FlagSet) *timeouts {
	t := &timeouts{}
	fs.DurationVar(&t.connect, "connect-timeout", defaultConnectTimeout,
		"give up on a server (a broker, PostgreSQL) that does not take the connection, and for PostgreSQL complete its start-up, within this long "+
			"(over the database URL's connect_timeout)")
	fs.DurationVar(&t.request, "request-timeout", defaultRequestTimeout,
		"give up on a step that a server does not answer within this long, retries included: a topic's metadata, its offsets, a group's state, "+
			"an offset commit, one database query or transaction")
	return t
}

func (t *timeouts) check() error {
	if t.connect <= 0 || t.request <= 0 {
		return usagef("--connect-timeout and --request-timeout must be positive, got %v and %v", t.connect, t.request)
	}
	return nil
}

// isTimeout reports whether err is a deadline that passed: a network
// timeout or a context deadline.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// kafkaConn is the cluster a command talks to: its seed brokers and the
// timeouts.
type kafkaConn struct {
	brokers []string
	to      *timeouts
}

// kafka returns the cluster of the --brokers flag (or KAFKA_BROKERS).
func (e *env) kafka(flagValue string, to *timeouts) (*kafkaConn, error) {
	if err := to.check(); err != nil {
		return nil, err
	}
	bs, err := e.brokers(flagValue)
	if err != nil {
		return nil, err
	}
	return &kafkaConn{brokers: bs, to: to}, nil
}

// kafkaAdmin is kafka, then the connection's admin client (kafkaConn.admin);
// the caller closes the client.
func (e *env) kafkaAdmin(flagValue string, to *timeouts) (*kafkaConn, *kgo.Client, *kadm.Client, error) {
	kc, err := e.kafka(flagValue, to)
	if err != nil {
		return nil, nil, nil, err
	}
	cl, adm, err := kc.admin()
	if err != nil {
		return nil, nil, nil, err
	}
	return kc, cl, adm, nil
}

func (k *kafkaConn) addrs() string { return strings.Join(k.brokers, ",") }

// opts are the client options that bound a request by the timeouts: the
// dial by --connect-timeout; the wait for an answer, and the retries of a
// request that failed, by --request-timeout. A broker that takes the
// connection and never answers fails the request once --request-timeout
// passed, not once it passed for every retry.
func (k *kafkaConn) opts() []kgo.Opt {
	return []kgo.Opt{
		kgo.DialTimeout(k.to.connect),
		kgo.RequestTimeoutOverhead(k.to.request),
		kgo.RetryTimeout(k.to.request),
	}
}

// client returns a client on the cluster for admin requests and
// producing. Nothing is produced to a topic that does not exist: the
// client never creates topics.
func (k *kafkaConn) client(opts ...kgo.Opt) (*kgo.Client, error) {
	base := append([]kgo.Opt{kgo.SeedBrokers(k.brokers...), kgo.ClientID("kscope-cli")}, k.opts()...)
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("bad --brokers %q: %w", k.addrs(), err)
	}
	return cl, nil
}

// admin returns a client on the cluster and its admin client; the caller
// closes the client.
func (k *kafkaConn) admin() (*kgo.Client, *kadm.Client, error) {
	cl, err := k.client()
	if err != nil {
		return nil, nil, err
	}
	return cl, kadm.NewClient(cl), nil
}

// do runs fn, one step of requests to the cluster, with a context that
// ends after --request-timeout, and explains a timeout: which brokers did
// not answer, within which timeout. kgo's own deadlines (see opts) bound
// each attempt of a request; this bounds the step, whatever the attempts.
func (k *kafkaConn) do(ctx context.Context, fn func(ctx context.Context) error) error {
	deadline := time.Now().Add(k.to.request)
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := fn(rctx)
	switch {
	case err == nil || ctx.Err() != nil:
		return err
	case !time.Now().Before(deadline):
		// The step's time is up, whatever the last attempt's error (a
		// dial that the deadline cut short, say).
		return k.silent(err)
	case isTimeout(err):
		return k.reachErr(err)
	}
	return err
}

// silent is the error of brokers that did not answer within
// --request-timeout.
func (k *kafkaConn) silent(err error) error {
	return fmt.Errorf("no answer from the brokers %s within --request-timeout %v: %w (they take connections but do not answer: check that --brokers or KAFKA_BROKERS names Kafka listeners, "+
		"without TLS, and that the cluster is not overloaded; raise --request-timeout for a slow one)", k.addrs(), k.to.request, err)
}

// reachErr explains an error from a request to the cluster: which brokers
// did not answer, within which timeout.
func (k *kafkaConn) reachErr(err error) error {
	var op *net.OpError
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &op) && op.Op == "dial" && isTimeout(err):
		return fmt.Errorf("cannot connect to the brokers %s: no connection within --connect-timeout %v: %w (check --brokers or KAFKA_BROKERS, and that the cluster is up)",
			k.addrs(), k.to.connect, err)
	case isTimeout(err):
		return k.silent(err)
	}
	return fmt.Errorf("cannot talk to the brokers %s: %w (check --brokers or KAFKA_BROKERS, and that the cluster is up)", k.addrs(), err)
}

// dbConn is the PostgreSQL database a command talks to.
type dbConn struct {
	*pgxpool.Pool
	addr  string // host:port, for messages
	to    *timeouts
	conns *connTracker
}

// closeGrace is how long Close lets the pool close its connections
// gracefully before it cuts them.
const closeGrace = time.Second

// Close closes the pool. A connection whose request timed out is closed by
// pgx in the background, after a cancel request to the server that waits
// up to 15 seconds for its answer; a server that does not answer would
// keep the command that long: past closeGrace, Close cuts the
// connections.
func (d *dbConn) Close() {
	done := make(chan struct{})
	go func() {
		d.Pool.Close()
		close(done)
	}()
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	d.conns.closeAll()
	<-done
}

// connTracker dials a pool's connections (pgconn.Config.DialFunc) and
// keeps them, to cut them at the end; it dials no more once cut.
type connTracker struct {
	dial   pgconn.DialFunc
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func (t *connTracker) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := t.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	t.conns = append(t.conns, c)
	return c, nil
}

func (t *connTracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for _, c := range t.conns {
		c.Close()
	}
}

// database returns a pool on the database of the --database-url flag (or
// DATABASE_URL), whose connections are made within --connect-timeout
// (over the URL's connect_timeout). It connects on first use.
func (e *env) database(flagValue string, to *timeouts) (*dbConn, error) {
	if err := to.check(); err != nil {
		return nil, err
	}
	url := flagValue
	if strings.TrimSpace(url) == "" {
		url = e.getenv("DATABASE_URL")
	}
	if strings.TrimSpace(url) == "" {
		return nil, usagef("no database given: set --database-url or DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("bad --database-url: %w", err)
	}
	cfg.ConnConfig.ConnectTimeout = to.connect
	conns := &connTracker{dial: cfg.ConnConfig.DialFunc}
	cfg.ConnConfig.DialFunc = conns.Dial
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("bad --database-url: %w", err)
	}
	addr := net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port))
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		addr = fmt.Sprintf("%s (port %d)", cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	}
	return &dbConn{Pool: pool, addr: addr, to: to, conns: conns}, nil
}

// request runs fn, one request to the database, with a context that ends
// after --request-timeout, and explains its error: which server did not
// answer, within which timeout.
func (d *dbConn) request(ctx context.Context, fn func(ctx context.Context) error) error {
	rctx, cancel := context.WithTimeout(ctx, d.to.request)
	defer cancel()
	return d.explain(ctx, fn(rctx))
}

// explain names the server and the timeout in err, an error of a request
// to the database made with a context derived from ctx.
func (d *dbConn) explain(ctx context.Context, err error) error {
	var ce *pgconn.ConnectError
	switch {
	case err == nil || ctx.Err() != nil:
		return err
	case errors.As(err, &ce) && isTimeout(err):
		return fmt.Errorf("PostgreSQL at %s did not complete the connection within --connect-timeout %v (it takes connections but does not answer: "+
			"check --database-url or DATABASE_URL, and that the server is up): %w", d.addr, d.to.connect, err)
	case errors.As(err, &ce):
		return fmt.Errorf("cannot connect to PostgreSQL at %s (check --database-url or DATABASE_URL, and that the server is up): %w", d.addr, err)
	case isTimeout(err):
		return fmt.Errorf("PostgreSQL at %s did not answer within --request-timeout %v (raise it for a slow server or a long request): %w", d.addr, d.to.request, err)
	}
	return err
}
