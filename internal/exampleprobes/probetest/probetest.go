// Package probetest checks, in the examples' tests, that an example
// serves its Kubernetes probes (see package exampleprobes).
package probetest

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/health"
	"github.com/kscope-dev/kscope/internal/exampleprobes"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// Served makes the example that test t runs as a service serve its
// probes on a free loopback port, and returns the channel that carries
// their base URL once they listen; Ready checks them there. It sets the
// environment: the test must not run in parallel.
func Served(t *testing.T) <-chan string {
	t.Helper()
	t.Setenv(exampleprobes.Env, "127.0.0.1:0")
	urls := make(chan string, 1)
	exampleprobes.Listening = func(base string) { urls <- base }
	t.Cleanup(func() { exampleprobes.Listening = nil })
	return urls
}

// Ready checks, over HTTP, that the probes at base answer 200 (within 30
// s for /readyz) with an "ok" report that checks every group in groups.
func Ready(t *testing.T, base string, groups ...string) {
	t.Helper()
	var last health.Report
	testenv.WaitFor(t, 30*time.Second, "/readyz 200 while the example runs", func() bool {
		code, rep := get(t, base+"/readyz")
		last = rep
		return code == http.StatusOK
	})
	for _, g := range groups {
		if !names(last, g) {
			t.Errorf("/readyz %+v does not check group %s", last, g)
		}
	}
	if code, rep := get(t, base+"/livez"); code != http.StatusOK || rep.Status != "ok" {
		t.Errorf("/livez %d %+v while the example runs, want 200", code, rep)
	}
	t.Logf("probes at %s: /readyz %+v", base, last)
}

// Expect makes the examples run in test t serve their probes on a free
// loopback port, and checks, when an example stops its runners, that
// /readyz and /livez answer 200 over HTTP (see Ready). The example must
// stop its runners from the test's goroutine. It fails the test if no
// example served the probes. It sets the environment: the test must not
// run in parallel.
func Expect(t *testing.T, groups ...string) {
	t.Helper()
	t.Setenv(exampleprobes.Env, "127.0.0.1:0")
	checked := false
	exampleprobes.BeforeStop = func(base string) {
		checked = true
		Ready(t, base, groups...)
	}
	t.Cleanup(func() {
		exampleprobes.BeforeStop = nil
		if !checked && !t.Failed() {
			t.Error("the example served no probes")
		}
	})
}

func get(t *testing.T, url string) (int, health.Report) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var rep health.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatalf("GET %s: the body is not a report: %v", url, err)
	}
	return resp.StatusCode, rep
}

func names(rep health.Report, group string) bool {
	for _, c := range rep.Checks {
		if c.Runner == group && c.OK {
			return true
		}
	}
	return false
}
