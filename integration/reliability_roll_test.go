package integration

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kscope-dev/kscope/consumer"
	"github.com/kscope-dev/kscope/internal/testenv"
)

// A rolling deploy, as Kubernetes does one: three member processes consume
// while records flow, and each in turn gets SIGTERM and a new process
// starts in its place. In the DB scope and the Kafka scope, under each
// group protocol: nothing lost, nothing applied twice, every key in order.
// Beside the row, the test logs the group's membership changes and the
// longest time a partition with records to consume made no progress.
func TestReliabilityRollingDeploy(t *testing.T) {
	for _, proto := range []consumer.GroupProtocol{consumer.GroupProtocolClassic, consumer.GroupProtocolConsumer} {
		for _, scope := range []string{"DB", "Kafka"} {
			t.Run(scope+"/"+string(proto), func(t *testing.T) {
				// The member processes read the protocol from their
				// environment, as the tests' base configurations do.
				t.Setenv(testenv.GroupProtocolEnv, string(proto))
				w := &rollWatch{}
				runScenario(t, relScenario{
					scope: scope, fault: "rolling deploy of 3 members, " + string(proto) + " protocol",
					children: true, name: "roll-" + strings.ToLower(scope) + "-" + string(proto),
					inject: func(e *relRun) { rollingDeploy(e, w) },
				})
				t.Logf("%s / %s protocol: %d membership changes, longest a partition went without progress: %s",
					scope, proto, w.changes, w.longest.Round(time.Millisecond))
			})
		}
	}
}

// rollingDeploy starts three members, then replaces each in turn: SIGTERM
// (a graceful stop: drain and commit) and a new member process.
func rollingDeploy(e *relRun, w *rollWatch) {
	members := []*relMember{startPod(e, 0), startPod(e, 1), startPod(e, 2)}
	stop := w.watch(e)
	defer stop()
	e.waitProgress(int64(e.total() / 10))
	for i := range 3 {
		if err := members[i].child.terminate(e.t); err != nil {
			e.t.Errorf("SIGTERM: member %d exited with %v, want a clean exit", i, err)
		}
		e.faults.Add(1)
		startPod(e, i)
		e.waitProgress(int64(e.total() / 10))
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
