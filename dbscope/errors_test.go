package dbscope

import (
	"context"
	"errors"
	"fmt"
	"io"
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
		fmt.Errorf("handler: %w", &pgconn.PgError{Code: "40001"}),
		io.ErrUnexpectedEOF,
		errors.New("conn closed"),
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
	}
	for _, err := range permanent {
		if IsTransient(err) {
			t.Errorf("%v: transient, want not", err)
		}
	}
}
