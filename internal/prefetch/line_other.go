//go:build !amd64 && !arm64

package prefetch

import "unsafe"

// line does nothing where kscope has no prefetch instruction to issue.
func line(unsafe.Pointer) {}
