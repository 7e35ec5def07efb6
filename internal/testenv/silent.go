package testenv

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// SilentServer listens on a loopback port and returns its address: it
// takes every connection and never answers, as a hung server does, or a
// port that something else listens on. It stops when t ends.
func SilentServer(t testing.TB) string {
	t.Helper()
	return serve(t, func(c net.Conn) { io.Copy(io.Discard, c) }) //nolint:errcheck // until the connection closes
}

// StalledPostgres listens on a loopback port and returns its address: it
// speaks PostgreSQL's protocol up to the end of a connection's start-up
// (no TLS, no password), then never answers a query, as a server hung
// after accepting a connection. It stops when t ends.
func StalledPostgres(t testing.TB) string {
	t.Helper()
	return serve(t, func(c net.Conn) {
		be := pgproto3.NewBackend(c, c)
		msg, err := be.ReceiveStartupMessage()
		if _, ok := msg.(*pgproto3.SSLRequest); ok && err == nil {
			if _, err := c.Write([]byte("N")); err != nil {
				return
			}
			_, err = be.ReceiveStartupMessage()
		}
		if err != nil {
			return
		}
		be.Send(&pgproto3.AuthenticationOk{})
		be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "17.0"})
		be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if err := be.Flush(); err != nil {
			return
		}
		io.Copy(io.Discard, c) //nolint:errcheck // until the connection closes
	})
}

// serve accepts connections on a loopback port and runs handle on each,
// until t ends: then it closes the listener and every connection, and
// waits for the handlers to return.
func serve(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { handle(c) })
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}
