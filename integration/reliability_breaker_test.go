package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/internal/testenv"
	"github.com/kscope-dev/kscope/retrytopic"
)

// A dependency outage with the circuit breaker open and a member
// SIGKILLed: two child members pay every record at a payment gateway
// through a breaker of the gateway (Failures 3, the failure policy's
// attempts in place, with a ladder of two retry topics behind them). While
// records flow, the gateway refuses every call (503) for 30 s (a few
// seconds in the short form); records go on being produced during the
// outage. Each member's breaker opens; one member is SIGKILLed while its
// breaker is open and a new one joins. When the gateway is back the
// breakers probe and close, and the stream finishes. Nothing is lost,
// nothing applied twice (effects in PostgreSQL, read_committed outputs),
// each key in order, and the group's retry topics and dead-letter topic
// hold no record: the outage sent nothing through the ladder.
func TestReliabilityBreakerOutage(t *testing.T) {
	for _, scope := range []string{"DB", "Kafka"} {
		t.Run(scope, func(t *testing.T) { breakerOutage(t, scope) })
	}
}

// breakerOutageTimes are the outage's length and the breaker's OpenFor.
func breakerOutageTimes() (outage, openFor time.Duration) {
	if reliabilityLong() {
		return 30 * time.Second, 5 * time.Second
	}
	return 5 * time.Second, 2 * time.Second
}

// payGateway is the dependency: it pays a record id (POST /pay/{id}), or
// refuses with 503 while it is down.
type payGateway struct {
	url  string
	srv  *http.Server
	down atomic.Bool

	mu      sync.Mutex
	paid    map[string]int
	refused []time.Time // when each call was refused
}

func startPayGateway(t *testing.T) *payGateway {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &payGateway{url: "http://" + ln.Addr().String(), paid: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /pay/{id}", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.down.Load() {
			g.refused = append(g.refused, time.Now())
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		g.paid[r.PathValue("id")]++
	})
	g.srv = &http.Server{Handler: mux}
	go g.srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { g.srv.Close() })
	return g
}

// refusals returns how many calls the gateway refused in [from, to).
func (g *payGateway) refusals(from, to time.Time) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, at := range g.refused {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// outageRun is a running breaker-outage scenario.
type outageRun struct {
	e       *relRun
	gw      *payGateway
	role    string
	env     []string
	members map[string]*child
	handled map[string]*atomic.Int64 // records each member handled
}

func newOutageRun(t *testing.T, scope string, openFor time.Duration) *outageRun {
	ctx := context.Background()
	keys, perKey := relSize()
	e := &relRun{t: t, sc: relScenario{scope: scope}, keys: keys, perKey: perKey,
		topic: "rel-breaker-in", group: "g-rel-breaker-" + strings.ToLower(scope)}
	e.k = testenv.KafkaT(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	o := &outageRun{e: e, gw: startPayGateway(t), role: "txn-breaker", members: map[string]*child{}, handled: map[string]*atomic.Int64{}}
	o.env = []string{gatewayEnv + "=" + o.gw.url, breakerOpenForEnv + "=" + openFor.String()}
	topics := []string{e.topic}
	if scope == "DB" {
		var url string
		url, e.pool = parkingDB(t)
		o.role = "db-breaker"
		o.env = append(o.env, "DATABASE_URL="+url)
	} else {
		topics = append(topics, e.topic+".out")
	}
	for _, tp := range topics {
		if err := e.k.CreateTopic(ctx, tp, 4); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// start starts a child member named name.
func (o *outageRun) start(name string) *child {
	o.e.t.Helper()
	handled := new(atomic.Int64)
	c := startChild(o.e.t, o.e.k, o.role, o.e.group, o.e.topic, time.Millisecond, func([]byte) { handled.Add(1) },
		append(o.env, childNameEnv+"="+name)...)
	o.members[name], o.handled[name] = c, handled
	return c
}

// produceOver produces recs in ten chunks spread over d, and reports on
// the channel when done.
func (o *outageRun) produceOver(recs []*kgo.Record, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		chunk := (len(recs) + 9) / 10
		for len(recs) > 0 {
			n := min(chunk, len(recs))
			if err := o.e.k.Produce(context.Background(), recs[:n]...); err != nil {
				done <- err
				return
			}
			recs = recs[n:]
			time.Sleep(d / 10) // the pace of the stream during the outage, not a synchronisation
		}
		done <- nil
	}()
	return done
}

// killWhileOpen waits until both members' breakers have opened and one of
// them is open again after a failed probe, SIGKILLs that one, and reports
// whether its breaker was still open when it died (the last state it
// printed).
func (o *outageRun) killWhileOpen(a, b *child) (victim *child, open bool) {
	o.e.t.Helper()
	testenv.WaitFor(o.e.t, 2*time.Minute, "both members' breakers open, one after a failed probe", func() bool {
		sa, na := a.events.breakerState()
		sb, nb := b.events.breakerState()
		switch {
		case na == 0 || nb == 0:
			return false
		case sa == "open" && na >= 2:
			victim = a
		case sb == "open" && nb >= 2:
			victim = b
		}
		return victim != nil
	})
	victim.kill()
	o.e.kills.Add(1)
	state, _ := victim.events.breakerState()
	return victim, state == "open"
}

func breakerOutage(t *testing.T, scope string) {
	start := time.Now()
	outage, openFor := breakerOutageTimes()
	o := newOutageRun(t, scope, openFor)
	e := o.e
	recs := testenv.KeyedRecords(e.topic, e.keys, e.perKey)
	n := len(recs)
	before, during, after := recs[:n*2/5], recs[n*2/5:n*7/10], recs[n*7/10:]
	// Half the records before the outage go first; the rest follow in
	// small steps, over 15 seconds at least, until both members handle
	// records (on Apache Kafka the second member's partitions come a
	// rebalance later, when the first may have handled everything
	// produced so far); past those, records of the outage's share go
	// ahead of it, for up to 2 minutes.
	first, rest := before[:len(before)/2], before[len(before)/2:]
	if err := e.k.Produce(context.Background(), first...); err != nil {
		t.Fatal(err)
	}
	a, b := o.start("a"), o.start("b")
	e.waitProgress(int64(len(first) / 4))
	both := func() bool { return o.handled["a"].Load() > 0 && o.handled["b"].Load() > 0 }
	step := max(len(rest)/150, 1)
	for deadline := time.Now().Add(2 * time.Minute); !both() && time.Now().Before(deadline); {
		src := &rest
		if len(rest) == 0 {
			src = &during // ahead of the outage: the outage keeps the rest
			if len(during) <= step {
				break
			}
		}
		next := (*src)[:min(step, len(*src))]
		*src = (*src)[len(next):]
		if err := e.k.Produce(context.Background(), next...); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the pace of the stream, not a synchronisation
	}
	if err := e.k.Produce(context.Background(), rest...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, "both members handling records", both)

	// The outage, while the stream goes on.
	o.gw.down.Store(true)
	outageStart := time.Now()
	produced := o.produceOver(during, outage*3/4)
	victim, killedOpen := o.killWhileOpen(a, b)
	killedAt := time.Now()
	o.start("c")
	time.Sleep(time.Until(outageStart.Add(outage))) // the outage's length: the fault itself
	o.gw.down.Store(false)
	outageEnd := time.Now()
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	if err := e.k.Produce(context.Background(), after...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, "every record done and committed", func() bool {
		return e.progress() >= int64(n) && e.k.CaughtUp(context.Background(), e.group, e.topic)
	})
	for name, c := range o.members {
		if c == victim {
			continue
		}
		if err := c.terminate(t); err != nil {
			t.Errorf("member %s exited with %v, want a clean exit", name, err)
		}
	}
	o.report(outageReport{start: start, outageStart: outageStart, outageEnd: outageEnd,
		killedAt: killedAt, killedOpen: killedOpen, victim: victim})
}

// outageReport is what the scenario saw, for its checks and its row.
type outageReport struct {
	start, outageStart, outageEnd, killedAt time.Time
	killedOpen                              bool
	victim                                  *child
}

// report checks the final state and adds the scenario's row.
func (o *outageRun) report(r outageReport) {
	e, t := o.e, o.e.t
	row := relRow{Scope: e.sc.scope, Records: e.total(), Kills: e.kills.Load()}
	if e.sc.scope == "DB" {
		row.Lost, row.Dups, row.Order = e.checkDB()
	} else {
		row.Lost, row.Dups, row.Order = e.checkKafka()
	}
	routed := o.routed()
	opens := 0
	for name, c := range o.members {
		state, n := c.events.breakerState()
		opens += n
		var states []string
		for _, ev := range c.events.list(breakerEvent) {
			states = append(states, fmt.Sprintf("%s at %s", ev.line, ev.at.Sub(r.outageStart).Round(time.Millisecond)))
		}
		t.Logf("member %s: breaker opened %d times, last %s; relative to the outage's start: %s", name, n, state, strings.Join(states, ", "))
		for _, ev := range c.events.list(routedEvent) {
			t.Errorf("member %s routed %s at %s (outage %s to %s)", name, ev.line,
				ev.at.Format("15:04:05.000"), r.outageStart.Format("15:04:05.000"), r.outageEnd.Format("15:04:05.000"))
		}
	}
	refused := o.gw.refusals(r.outageStart, r.outageEnd)
	row.Faults = int64(refused)
	row.Fault = fmt.Sprintf("dependency down %s while records flow, circuit breaker open (%d opens, %d calls refused), a member SIGKILLed while open (%d records in the retry and dead-letter topics)",
		r.outageEnd.Sub(r.outageStart).Round(time.Second), opens, refused, len(routed))
	row.Duration = time.Since(r.start)
	row.Passed = row.Lost == 0 && row.Dups == 0 && row.Order == 0 && len(routed) == 0 && r.killedOpen && !t.Failed()
	addRelRow(row)
	t.Logf("%s / %s: %d records in %s; killed at %s, %s into the outage", row.Scope, row.Fault, row.Records,
		row.Duration.Round(time.Millisecond), r.killedAt.Format("15:04:05.000"), r.killedAt.Sub(r.outageStart).Round(time.Millisecond))
	if !r.killedOpen {
		state, _ := r.victim.events.breakerState()
		t.Errorf("the SIGKILLed member's breaker was %s when it died, want open", state)
	}
	// Before a member's breaker first opens, at most its failures and the
	// calls out then are refused; after that only probes are.
	if bound := len(o.members)*(breakerChildFailures+breakerChildShards) + opens; refused > bound {
		t.Errorf("the gateway refused %d calls during the outage, want at most %d: calls went on while the breakers were open", refused, bound)
	}
	if len(routed) > 0 {
		t.Errorf("%d records in the retry and dead-letter topics, want none: %v", len(routed), routed)
	}
	if row.Lost+row.Dups+row.Order > 0 {
		t.Errorf("%d lost, %d duplicates, %d order violations", row.Lost, row.Dups, row.Order)
	}
}

// routed returns the records (as "topic: value") the group's retry topics
// and dead-letter topic hold, read_committed.
func (o *outageRun) routed() []string {
	e := o.e
	topics, err := e.k.Admin().ListTopics(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for name := range topics {
		if _, retry := retrytopic.RetryTopicDelay(e.group, name); !retry && name != retrytopic.DLTopic(e.group) {
			continue
		}
		for _, r := range e.k.ReadAll(e.t, name) {
			out = append(out, name+": "+string(r.Value))
		}
	}
	return out
}
