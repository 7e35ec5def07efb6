package dbscope

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kscope-dev/kscope/internal/backoff"
)

// DefaultStartTimeout is how long Run waits at start for a database that
// does not answer (Options.StartTimeout).
const DefaultStartTimeout = time.Minute

// DatabaseError is what Run returns at start when the runner cannot use
// its database: PostgreSQL refused the login (a wrong user or password,
// SQLSTATE class 28), the database does not exist (3D000), the user lacks
// a privilege (42501) or another error of [IsDeploymentError] (Code says
// which), or no server answered within Options.StartTimeout (TimedOut;
// Err is the last error, a refused connection or a timeout). Setting
// names what to change. Test for it with errors.As; errors.Is and
// errors.As also reach Err (a *pgconn.PgError, say).
type DatabaseError struct {
	Addr     string // the server tried, host:port (from Options.Pool's connection string)
	Database string // the database name of the connection string
	User     string // the user of the connection string
	Code     string // PostgreSQL's SQLSTATE code; empty when no server answered
	TimedOut bool   // no server answered within Options.StartTimeout
	Waited   time.Duration
	Setting  string // what to change, in words
	Err      error
}

func (e *DatabaseError) Error() string {
	where := fmt.Sprintf("PostgreSQL at %s (database %q, user %q)", e.Addr, e.Database, e.User)
	if e.TimedOut {
		return fmt.Sprintf("dbscope: %s did not answer within %v (Options.StartTimeout): %v; %s", where, e.Waited.Round(100*time.Millisecond), e.Err, e.Setting)
	}
	return fmt.Sprintf("dbscope: %s refused the runner (SQLSTATE %s): %v; %s", where, e.Code, e.Err, e.Setting)
}

func (e *DatabaseError) Unwrap() error { return e.Err }

// newDatabaseError returns the DatabaseError of err for pool: a
// deployment error, or, when waited is not zero, a database that did not
// answer for that long.
func newDatabaseError(pool *pgxpool.Pool, err error, waited time.Duration) *DatabaseError {
	cc := pool.Config().ConnConfig
	e := &DatabaseError{Addr: net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), Database: cc.Database, User: cc.User, Err: err}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		e.Code = pg.Code
	}
	const conn = "Options.Pool's connection string (DATABASE_URL, or pgxpool.Config.ConnConfig)"
	switch {
	case waited > 0:
		e.TimedOut, e.Waited = true, waited
		e.Setting = "check that the server runs and accepts connections from this host, and the host and port of " + conn +
			"; raise Options.StartTimeout to wait longer for a server that starts slowly"
	case strings.HasPrefix(e.Code, "28"):
		e.Setting = fmt.Sprintf("check the user (%q) and password of %s, and that pg_hba.conf lets that user in from this host", e.User, conn)
	case e.Code == "3D000":
		e.Setting = fmt.Sprintf("check the database name (%q, the path of the URL) of %s, or create the database", e.Database, conn)
	case e.Code == "42501":
		e.Setting = fmt.Sprintf("grant user %q CONNECT on the database and SELECT, INSERT, UPDATE and DELETE on kscope's tables (Options.TablePrefix), "+
			"or connect as another user in %s", e.User, conn)
	case strings.HasPrefix(e.Code, "3F"):
		e.Setting = "check the search_path of " + conn + ", and that kscope's tables were migrated into that schema (dbscope.Migrate)"
	default:
		e.Setting = "check the user, database and search_path of " + conn + ", and that dbscope.Migrate ran on that database"
	}
	return e
}

// startWait is what Run waits for at start, for Stats.Waiting.
type startWait struct {
	mu  sync.Mutex
	why string
}

func (w *startWait) set(why string) {
	w.mu.Lock()
	w.why = why
	w.mu.Unlock()
}

func (w *startWait) get() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.why
}

// checkTables is Start's schema check. A database that does not answer is
// retried with backoff, logged, and reported in Stats.Waiting, for up to
// Options.StartTimeout since the first failure; then, or at once for a
// deployment error (IsDeploymentError), Run fails with a *DatabaseError.
func (s *dbScope) checkTables(ctx context.Context) error {
	if max := int(s.o.Pool.Config().MaxConns); max < s.shards {
		s.log.Warn(fmt.Sprintf("kscope: the PostgreSQL pool has fewer connections than the runner has key-shards: workers wait for a connection "+
			"and the pipeline runs at the pool's width; add pool_max_conns=%d to the database URL (or set pgxpool.Config.MaxConns to %d), "+
			"or set consumer.Config.Shards to %d", s.shards, s.shards, max),
			"pool_max_conns", max, "shards", s.shards)
	}
	defer s.waiting.set("")
	var first time.Time
	for attempt := 1; ; attempt++ {
		err := checkSchema(ctx, s.o.Pool, s.o.TablePrefix)
		var se *SchemaError
		switch {
		case err == nil:
			if attempt > 1 {
				s.log.Info("kscope: the database answered; starting", "attempts", attempt, "waited", time.Since(first).Round(time.Millisecond))
			}
			return nil
		case errors.As(err, &se):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case IsDeploymentError(err):
			return newDatabaseError(s.o.Pool, err, 0)
		}
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		waited := now.Sub(first)
		if waited >= s.o.StartTimeout {
			return newDatabaseError(s.o.Pool, err, waited)
		}
		d := min(backoff.Delay(attempt, retryBase, retryCap), s.o.StartTimeout-waited)
		de := newDatabaseError(s.o.Pool, err, 0)
		s.waiting.set(fmt.Sprintf("the database at %s does not answer: %v", de.Addr, err))
		s.log.Warn("kscope: the database does not answer at start; retrying", "addr", de.Addr, "database", de.Database, "err", err,
			"attempt", attempt, "retry_in", d, "gives_up_in", (s.o.StartTimeout - waited).Round(time.Millisecond))
		if !backoff.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}
