package dbscope

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestIsTransient(t *testing.T) {
	transient := []error{
		&pgconn.PgError{Code: "40001"},
		&pgconn.PgError{Code: "40P01"},
		&pgconn.PgError{Code: "57P01"},
		&pgconn.PgError{Code: "08006"},
		&pgconn.PgError{Code: "57014"},
		&pgconn.PgError{Code: "53100"}, // disk_full
		&pgconn.PgError{Code: "53200"}, // out_of_memory
		&pgconn.PgError{Code: "58030"}, // io_error
		fmt.Errorf("handler: %w", &pgconn.PgError{Code: "40001"}),
		&pgconn.ConnectError{},
	}
	for _, err := range transient {
		if !IsTransient(err) {
			t.Errorf("%v: not transient, want transient", err)
		}
	}
	permanent := []error{
		nil,
		&pgconn.PgError{Code: "23505"}, // unique_violation: the handler's own bug
		&pgconn.PgError{Code: "42P01"}, // undefined_table
		errors.New("card declined"),
		context.Canceled,
		// A handler's own I/O: a truncated body, a dropped HTTP
		// connection. Not PostgreSQL's.
		io.ErrUnexpectedEOF,
		fmt.Errorf("decoding: %w", io.EOF),
		&net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")},
		errors.New("conn closed"),
		errors.New("read: connection reset by peer"),
	}
	for _, err := range permanent {
		if IsTransient(err) {
			t.Errorf("%v: transient, want not", err)
		}
	}
}
