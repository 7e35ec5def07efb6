package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy listens on addr and forwards every connection to target, until
// the test ends: a server that is not there yet (nothing listens on addr
// until Proxy is called) or that comes up behind a stable address.
func Proxy(t testing.TB, addr, target string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, d)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(d, c); d.Close() }() //nolint:errcheck // ends with either side
			go func() { defer wg.Done(); io.Copy(c, d); c.Close() }() //nolint:errcheck // ends with either side
		}
	}()
}
