package testenv

import "syscall"

// childProcAttr puts a started server in its own process group, so that it
// and anything it starts are stopped together, and has the kernel kill it
// when this process dies (a killed or crashed test leaves no server
// behind).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
