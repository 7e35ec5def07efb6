package dbscope

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsTransient reports whether err is a PostgreSQL failure that a new
// transaction can succeed after: a serialization failure, a deadlock, a lost
// or refused connection, a server shutting down or restarting, too many
// connections, a statement or lock timeout, a server out of disk space or
// memory, or an I/O error on it. It is decided from what pgx
// reports — the server's SQLSTATE code ([pgconn.PgError]), a connection
// that could not be made ([pgconn.ConnectError]), a request that never
// reached the server ([pgconn.SafeToRetry]) or timed out inside pgx
// ([pgconn.Timeout]) — never from an error's text, and an io.EOF or a
// net.Error of the handler's own (an HTTP call) is not transient.
//
// The DB scope retries a batch that fails this way in place, with backoff,
// and never commits its offsets past it. A handler error marked with a
// class (consumer.Skip, Terminal, Retryable, DecodeError, or one
// Policy.Classify gives) follows the failure policy even when it wraps a
// transient error; only a lost connection, which takes the transaction
// with it, retries the batch whatever the class.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"55P03", // lock_not_available
			"57014", // query_canceled (statement_timeout)
			"57P01", // admin_shutdown (pg_terminate_backend)
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now
			"53300", // too_many_connections
			"53400": // configuration_limit_exceeded
			return true
		}
		// connection_exception, insufficient_resources (disk full, out of
		// memory) and system_error (an I/O error): the server's failure,
		// not the record's, and one that heals.
		return strings.HasPrefix(pg.Code, "08") || strings.HasPrefix(pg.Code, "53") || strings.HasPrefix(pg.Code, "58")
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ce *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.As(err, &ce)
}

// IsDeploymentError reports whether err is a PostgreSQL error that says
// the deployment is wrong rather than the record: the statement meets a
// schema, a grant or a login that is not what the service expects. Such
// an error fails every record alike until an operator fixes the
// deployment (runs the service's migration, grants a privilege, corrects
// the connection string), so no record is to blame for it. It is decided
// from the server's SQLSTATE code ([pgconn.PgError]):
//
//	class 42    syntax error or access rule violation, among them
//	            42P01 undefined_table, 42703 undefined_column,
//	            42883 undefined_function, 42501 insufficient_privilege,
//	            42601 syntax_error
//	class 28    invalid authorization specification
//	            (28000, 28P01 invalid_password)
//	3D000       invalid_catalog_name: the database does not exist
//	class 3F    invalid schema name (3F000)
//
// The DB scope does not route a record whose transaction fails this way:
// its key-shard holds the record and those behind it, retrying with
// backoff, until the statement succeeds (see [New]); at start, Run fails
// with a [*DatabaseError]. A handler whose SQL is built from the record
// (a table named by the record, say), where such an error is the
// record's fault, marks it with a class (consumer.Terminal, or
// Policy.Classify in consumer.Config.Failures): a classed error follows
// the failure policy whatever it wraps.
func IsDeploymentError(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || len(pg.Code) != 5 {
		return false
	}
	switch pg.Code[:2] {
	case "42", "28", "3F":
		return true
	}
	return pg.Code == "3D000"
}
