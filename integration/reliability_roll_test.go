package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A rolling deploy, as Kubernetes does one: member processes consume while
// records flow, and each in turn gets SIGTERM and a new process starts in
// its place. In the DB scope and the Kafka scope, under each group
// protocol: nothing lost, nothing applied twice, every key in order. Each
// row also reports the group's membership changes and the longest time a
// partition with records to consume made no progress.
//
// The short form (make test, make test-kafka) rolls 3 members over 4
// partitions once. The long form (make reliability) runs on a 3-node Apache
// Kafka cluster: 6 members over 48 partitions, two full rolls, then two
// members SIGKILLed while the group rebalances.
func TestReliabilityRollingDeploy(t *testing.T) {
	plan := rollPlanFor()
	var cluster *testenv.Kafka
	if plan.nodes > 0 {
		cluster = testenv.ApacheKafkaT(t, testenv.ApacheOptions{Nodes: plan.nodes})
	}
	for _, proto := range []consumer.GroupProtocol{consumer.GroupProtocolClassic, consumer.GroupProtocolConsumer} {
		for _, scope := range []string{"DB", "Kafka"} {
			t.Run(scope+"/"+string(proto), func(t *testing.T) {
				// The member processes read the protocol from their
				// environment, as the tests' base configurations do.
				t.Setenv(testenv.GroupProtocolEnv, string(proto))
				w := &rollWatch{}
				runScenario(t, relScenario{
					scope: scope, fault: plan.String() + ", " + string(proto) + " protocol",
					children: true, name: "roll-" + strings.ToLower(scope) + "-" + string(proto),
					cluster: cluster, apache: plan.nodes, partitions: plan.partitions, keys: plan.keys, perKey: plan.perKey,
					table:  tableRoll,
					inject: func(e *relRun) { rollingDeploy(e, w, plan) },
					row: func(r *relRow) {
						r.Members, r.Rebalances, r.Stall = plan.members, w.changes, w.longest
					},
				})
				t.Logf("%s / %s protocol: %d membership changes, longest a partition went without progress: %s",
					scope, proto, w.changes, w.longest.Round(time.Millisecond))
			})
		}
	}
}

// tableRoll names the report table of rolling deploys.
const tableRoll = "rolling deploys"

// rollPlan is a rolling deploy: how many members, over how many
// partitions, rolled how many times, then how many SIGKILLed during a
// rebalance; on an Apache Kafka cluster of nodes started for it (0: the
// suite's backend).
type rollPlan struct {
	members, rolls, kills int
	partitions            int32
	keys, perKey          int
	nodes                 int
}

func rollPlanFor() rollPlan {
	if reliabilityLong() {
		return rollPlan{members: 6, rolls: 2, kills: 2, partitions: 48, keys: 96, perKey: 60, nodes: 3}
	}
	keys, perKey := relSize()
	return rollPlan{members: 3, rolls: 1, partitions: 4, keys: keys, perKey: perKey}
}

func (p rollPlan) String() string {
	s := fmt.Sprintf("rolling deploy of %d members (%d roll", p.members, p.rolls)
	if p.rolls > 1 {
		s += "s"
	}
	s += ")"
	if p.kills > 0 {
		s += fmt.Sprintf(", %d SIGKILLed during a rebalance", p.kills)
	}
	return s
}

// rollingDeploy starts the plan's members, then replaces each in turn,
// roll after roll: SIGTERM (a graceful stop: drain and commit) and a new
// member process. Then, when the plan says so, it SIGKILLs members while
// the group rebalances.
func rollingDeploy(e *relRun, w *rollWatch, p rollPlan) {
	members := make([]*relMember, p.members)
	for i := range members {
		members[i] = startPod(e, i)
	}
	stop := w.watch(e)
	defer stop()
	// Each step waits for a share of the stream, leaving records for the
	// steps after it.
	step := int64(e.total() / (p.members*p.rolls + 4))
	e.waitProgress(step)
	for range p.rolls {
		for i := range members {
			if err := members[i].child.terminate(e.t); err != nil {
				e.t.Errorf("SIGTERM: member %d exited with %v, want a clean exit", i, err)
			}
			e.faults.Add(1)
			members[i] = startPod(e, i)
			e.waitProgress(step)
		}
	}
	if p.kills > 0 {
		killDuringRebalance(e, members, p.kills)
		e.waitProgress(step)
	}
}

// killDuringRebalance starts one more member, which makes the group
// rebalance, and SIGKILLs n members while it does; a new process takes
// each killed member's place (in the Kafka scope, with its transactional
// id, so it fences what the killed one left open).
func killDuringRebalance(e *relRun, members []*relMember, n int) {
	startPod(e, len(members))
	state := waitRebalancing(e, 20*time.Second)
	for i := 1; i <= n; i++ {
		members[i].child.kill()
		e.kills.Add(1)
	}
	e.t.Logf("SIGKILLed %d members, the group's state then: %s", n, state)
	for i := 1; i <= n; i++ {
		members[i] = startPod(e, i)
	}
}

// waitRebalancing polls the group's state until it is no longer stable (a
// rebalance began) or d passed, and returns the last state seen.
func waitRebalancing(e *relRun, d time.Duration) string {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	state := "unknown"
	for {
		if s := groupState(ctx, e); s != "" {
			state = s
			if s != "Stable" && s != "Empty" {
				return state
			}
		}
		select {
		case <-ctx.Done():
			return state + " (no rebalance seen within " + d.String() + ")"
		case <-tick.C:
		}
	}
}

// groupState is the group's state as its coordinator describes it, under
// either protocol; empty when it does not answer.
func groupState(ctx context.Context, e *relRun) string {
	if testenv.GroupProtocol() == string(consumer.GroupProtocolConsumer) {
		described, err := e.k.Admin().DescribeConsumerGroups(ctx, e.group)
		if err != nil {
			return ""
		}
		for _, g := range described {
			return g.State
		}
		return ""
	}
	described, err := e.k.Admin().DescribeGroups(ctx, e.group)
	if err != nil {
		return ""
	}
	for _, g := range described {
		return g.State
	}
	return ""
}

// writeRollTable writes the rolling-deploy rows of the report.
func writeRollTable(b *strings.Builder, rows []relRow) {
	b.WriteString("\n## Rolling deploys\n\n")
	b.WriteString("Member processes consume while records flow; each in turn gets SIGTERM and a\n")
	b.WriteString("new process takes its place, as a Kubernetes rolling update does; in the long\n")
	b.WriteString("form two members are then SIGKILLed while the group rebalances\n")
	b.WriteString("(`TestReliabilityRollingDeploy`). Rebalances are the changes of the group's\n")
	b.WriteString("membership seen from outside; the stall is the longest time a partition\n")
	b.WriteString("with records to consume kept the same committed offset. In the Kafka scope a\n")
	b.WriteString("SIGKILLed member leaves its transaction open, and the offsets of its\n")
	b.WriteString("partitions wait until that transaction ends: its successor, started with\n")
	b.WriteString("the same transactional id, fences it (without a successor, the\n")
	b.WriteString("transaction timeout ends it).\n\n")
	b.WriteString("| scope | deploy | members | partitions | Kafka | records | rebalances | longest stall | kills | lost | duplicates | order violations | time | result |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for _, r := range rows {
		if r.Table != tableRoll {
			continue
		}
		res := "pass"
		if !r.Passed {
			res = "FAIL"
		}
		kafka := "the suite's"
		if r.Nodes > 0 {
			kafka = fmt.Sprintf("%d-node Apache Kafka", r.Nodes)
		}
		fmt.Fprintf(b, "| %s | %s | %d | %d | %s | %d | %d | %.1fs | %d | %d | %d | %d | %.1fs | %s |\n",
			r.Scope, r.Fault, r.Members, r.Partitions, kafka, r.Records, r.Rebalances, r.Stall.Seconds(),
			r.Kills, r.Lost, r.Dups, r.Order, r.Duration.Seconds(), res)
	}
}

// startPod starts member process i of a StatefulSet: its name, and so its
// transactional id in the Kafka scope, is the one the member it replaces
// had.
func startPod(e *relRun, i int) *relMember {
	e.t.Helper()
	role, env := "db", []string{e.dbURL}
	if e.sc.scope == "Kafka" {
		role, env = "txn", nil
	}
	env = append(env, childNameEnv+"=-"+strconv.Itoa(i))
	c := startChild(e.t, e.k, role, e.group, e.topic, 200*time.Microsecond, func([]byte) {}, env...)
	m := &relMember{name: "pod-" + strconv.Itoa(i), child: c}
	e.members = append(e.members, m)
	return m
}

// rollWatch samples a scenario's group while it runs: how often the set of
// its members changed, and the longest time a partition behind its end
// offset kept the same committed offset.
type rollWatch struct {
	changes int
	longest time.Duration
}

// watch samples every 50ms until the returned stop is called.
func (w *rollWatch) watch(e *relRun) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		last := map[int32]int64{}
		since := map[int32]time.Time{}
		var members string
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.sampleProgress(ctx, e, last, since)
			if m := groupMembers(ctx, e); m != "" && m != members {
				if members != "" {
					w.changes++
				}
				members = m
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// sampleProgress updates the longest stall from the group's committed
// offsets and the topic's end offsets.
func (w *rollWatch) sampleProgress(ctx context.Context, e *relRun, last map[int32]int64, since map[int32]time.Time) {
	committed, err := e.k.CommittedOffsets(ctx, e.group, e.topic)
	if err != nil {
		return
	}
	ends, err := e.k.EndOffsets(ctx, e.topic)
	if err != nil {
		return
	}
	now := time.Now()
	for p, end := range ends {
		c := committed[p]
		if prev, ok := last[p]; !ok || c != prev || c >= end {
			last[p], since[p] = c, now
			continue
		}
		w.longest = max(w.longest, now.Sub(since[p]))
	}
}

// groupMembers is the sorted list of the group's member ids, as the
// coordinator describes it under either protocol; empty when it does not
// answer.
func groupMembers(ctx context.Context, e *relRun) string {
	described, err := e.k.Admin().DescribeGroups(ctx, e.group)
	if err != nil {
		return ""
	}
	var ids []string
	for _, g := range described {
		for _, m := range g.Members {
			ids = append(ids, m.MemberID)
		}
	}
	if len(ids) == 0 {
		// A consumer-protocol (KIP-848) group is described by its own
		// request.
		next, err := e.k.Admin().DescribeConsumerGroups(ctx, e.group)
		if err != nil {
			return ""
		}
		for _, g := range next {
			for _, m := range g.Members {
				ids = append(ids, m.MemberID)
			}
		}
	}
	slices.Sort(ids)
	return strings.Join(ids, ",")
}
