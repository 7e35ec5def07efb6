//go:build !gc || purego || !(amd64 || arm64)

package prefetch

import "unsafe"

// line does nothing where kscope has no prefetch instruction to issue, or
// is built without assembly (the purego tag, or a toolchain other than gc).
func line(unsafe.Pointer) {}
