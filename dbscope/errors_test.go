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

func TestIsDeploymentError(t *testing.T) {
	deployment := []error{
		&pgconn.PgError{Code: "42P01"}, // undefined_table
		&pgconn.PgError{Code: "42703"}, // undefined_column
		&pgconn.PgError{Code: "42501"}, // insufficient_privilege
		&pgconn.PgError{Code: "42601"}, // syntax_error
		&pgconn.PgError{Code: "28P01"}, // invalid_password
		&pgconn.PgError{Code: "28000"}, // invalid_authorization_specification
		&pgconn.PgError{Code: "3D000"}, // invalid_catalog_name
		&pgconn.PgError{Code: "3F000"}, // invalid_schema_name
		fmt.Errorf("handler: %w", &pgconn.PgError{Code: "42P01"}),
	}
	for _, err := range deployment {
		if !IsDeploymentError(err) {
			t.Errorf("%v: not a deployment error, want one", err)
		}
	}
	record := []error{
		nil,
		&pgconn.PgError{Code: "23505"}, // unique_violation
		&pgconn.PgError{Code: "22P02"}, // invalid_text_representation: the record's data
		&pgconn.PgError{Code: "40001"}, // transient
		&pgconn.PgError{Code: "3D"},
		&pgconn.ConnectError{},
		errors.New("relation \"t\" does not exist"), // decided from the code, never the text
	}
	for _, err := range record {
		if IsDeploymentError(err) {
			t.Errorf("%v: a deployment error, want not", err)
		}
	}
}
