//go:build !linux

package testenv

import "syscall"

// childProcAttr puts a started server in its own process group, so that it
// and anything it starts are stopped together.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
