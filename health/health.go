package health

import (
	"encoding/json"
	"net/http"
	"path"

	"github.com/kscope-dev/kscope/consumer"
)

// Runner is what the handler reads of a runner: *consumer.Runner and the
// runners that embed it (dbscope.Runner, txn.Runner) implement it.
type Runner interface {
	Health() consumer.Health
}

// Handler is an http.Handler that serves /livez and /readyz for its
// runners. Build one with [New].
type Handler struct {
	runners []Runner
}

// New returns a handler for runners. It checks every runner at each
// request; a handler with no runner fails both probes, so that a service
// that forgot to pass its runners does not report itself healthy.
func New(runners ...Runner) *Handler {
	return &Handler{runners: append([]Runner(nil), runners...)}
}

// Check is one runner's verdict in a probe's body.
type Check struct {
	Runner  string   `json:"runner"`            // the runner's consumer group
	OK      bool     `json:"ok"`                // live (for /livez) or ready (for /readyz)
	Reasons []string `json:"reasons,omitempty"` // why not, one sentence a reason
}

// Report is a probe's body: Status is "ok" when every runner passed, else
// "not live" (for /livez) or "unready" (for /readyz).
type Report struct {
	Status string  `json:"status"`
	Checks []Check `json:"checks"`
}

// Live reports whether every runner is live, with each one's check.
func (h *Handler) Live() Report { return h.report(false) }

// Ready reports whether every runner is ready, with each one's check.
func (h *Handler) Ready() Report { return h.report(true) }

func (h *Handler) report(ready bool) Report {
	rep := Report{Status: "ok", Checks: make([]Check, 0, len(h.runners))}
	failed := "not live"
	if ready {
		failed = "unready"
	}
	if len(h.runners) == 0 {
		rep.Status = failed
		rep.Checks = append(rep.Checks, Check{Reasons: []string{"no runner to check: pass the service's runners to health.New"}})
		return rep
	}
	for _, r := range h.runners {
		st := r.Health()
		c := Check{Runner: st.Group, OK: st.Live, Reasons: st.NotLive}
		if ready {
			c.OK, c.Reasons = st.Ready, st.NotReady
		}
		if !c.OK {
			rep.Status = failed
		}
		rep.Checks = append(rep.Checks, c)
	}
	return rep
}

// ServeHTTP answers GET and HEAD requests whose path ends in /livez or
// /readyz (so the handler may be mounted under a prefix) with 200 when
// every runner passes and 503 when one does not, and a JSON [Report] as
// the body. Other paths get 404, other methods 405.
func (h *Handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	probe := path.Base(req.URL.Path)
	if probe != "livez" && probe != "readyz" {
		http.NotFound(w, req)
		return
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "health: method not allowed; probes use GET", http.StatusMethodNotAllowed)
		return
	}
	rep := h.Live()
	if probe == "readyz" {
		rep = h.Ready()
	}
	body, err := json.Marshal(rep)
	if err != nil {
		http.Error(w, "health: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	code := http.StatusOK
	if rep.Status != "ok" {
		code = http.StatusServiceUnavailable
	}
	w.WriteHeader(code)
	if req.Method == http.MethodGet {
		w.Write(append(body, '\n'))
	}
}
