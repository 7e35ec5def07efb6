// Package prefetch asks the CPU to start loading memory that the caller
// reads a little later, so that the wait for it overlaps other work.
//
// The poll loop reads each record's key to route it, and the key lies in
// the fetch response the client decoded on another goroutine, often on
// another core, a whole response earlier: by then it has left the core's
// caches. Routing a record took 66 to 98 ns on the benchmark's machine
// (512 KiB of L2 cache a core), about half of it waiting for the key, and
// 33 to 44 ns once the key was asked for a few records ahead. A prefetch
// is a hint: it never faults and changes no value. On an architecture
// other than amd64 and arm64, built with the purego tag, or by a toolchain
// other than gc, Bytes does nothing.
package prefetch

import "unsafe"

// Bytes asks the CPU to start loading the cache line that holds b's first
// byte into its caches. It returns at once.
func Bytes(b []byte) {
	if len(b) > 0 {
		line(unsafe.Pointer(unsafe.SliceData(b)))
	}
}
