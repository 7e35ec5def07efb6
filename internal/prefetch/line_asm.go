//go:build gc && !purego && (amd64 || arm64)

package prefetch

import "unsafe"

// line issues the CPU's prefetch instruction for the cache line at p
// (prefetch_amd64.s, prefetch_arm64.s).
//
//go:noescape
func line(p unsafe.Pointer)
