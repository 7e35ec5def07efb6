package main

import (
	"fmt"
	"testing"
)

// nopT lets the demo use testenv's helpers outside a test: a failure
// panics with its message.
type nopT struct{ testing.TB }

func (nopT) Helper()                           {}
func (nopT) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (nopT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
